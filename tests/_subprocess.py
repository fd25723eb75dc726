"""Settings shared by the tests that start Python subprocesses (the examples' smoke runs, the
multi-device and two-process runs). The suite runs on every core through pytest-xdist, so such a
test simply waits for its subprocess while the other worker goes on."""

#: XLA without LLVM optimisation passes, for subprocesses whose time is mostly compiling (smoke runs, the
#: multi-device checks): the examples' smoke runs took 30-40 % less CPU time with it
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
