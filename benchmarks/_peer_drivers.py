"""One run of one implementation for ``benchmarks/peers.py``, executed by that implementation's own Python.

Usage (``peers.py`` does this; ``ARGS.json`` holds the run's settings)::

    VENV/bin/python benchmarks/_peer_drivers.py {split,authors,bde,ours,authors_sampler} ARGS.json
    VENV/bin/python benchmarks/_peer_drivers.py {bde_estimator,ours_estimator} ARGS.json   # benchmarks/estimators.py

Each driver starts its clocks on its first line, before JAX or the implementation is imported, and stops them
when the fitted posterior (deep ensemble + warmup + sampling) is in memory: ``fit_wall`` and ``fit_cpu``
(process CPU, every thread) are what a user waits for, imports and compilation included. Trace + compile
seconds are summed from ``jax.monitoring`` (the events in ``_common.COMPILE_EVENTS``, which the JAX releases of
all three environments emit). Afterwards, untimed, the driver writes the posterior predictive's ``mu`` and
``sigma`` on the test rows, shape ``(draws, n_test)`` each, to ``WORKDIR/predictions.npz``; ``peers.py``
scores all implementations alike from those files. The last line of stdout is ``RESULT {json}``.

The three drivers, each configured as its documentation says:

- ``authors``: the MILE authors' ``train.py`` pipeline (``train_bde(config, devices)``, which sets the number
  of host devices to ``min(devices, chains)`` as ``train.py -d`` does) on their
  ``experiments/replicate_uci/mclmc.yaml`` with the budget, chain count and seed replaced; their HTML report
  (a notebook run after sampling) is skipped.
- ``split`` (in the authors' environment, untimed): their data loader's split for the seed (full-data
  standardisation, a permutation from the seed, 70/10/20) saved to ``WORKDIR/split.npz``; the authors' run
  makes the same split itself, the others receive it as arrays.
- ``bde``: ``BdeRegressor`` from scikit-learn-contrib ``bde`` with ``XLA_FLAGS`` exposing ``devices`` host
  devices (its README's advice), the authors' network and ensemble settings, fitted on the training rows (the
  rows the others' samplers condition on) with the validation fraction that holds out as many of them as the
  split's validation part has, for its ensemble's early stopping.
- ``ours``: the README's path: ``numpyro.set_host_device_count(devices)``, then
  ``MCMC(MILE(mlp_regression), ..., chain_method="vectorized")`` with NumPyro's progress bar as it defaults,
  pretraining its own ensemble with the split's validation rows for early stopping. ``progress_bar`` in
  ARGS.json (a second row, not the headline) sets NumPyro's bar explicitly. It saves its deep ensemble's members to
  ``WORKDIR/ensemble.npz``; with ``init_from`` (a folder of the authors' warmstart parameter files) it starts from
  the authors' ensemble instead of training its own (``ours-authors-ensemble``), with ``init_npz`` from a saved
  ensemble of its own and the key ``seed + key_offset`` (``ours-resampled``, the noise floor).
- ``authors_sampler``: the authors' tuning and sampling code started from numpyro_mile's ensemble (``init``), so
  that the two samplers can be compared from one ensemble (``authors-sampler``).
"""

from __future__ import annotations

import time

_START_WALL, _START_CPU = time.perf_counter(), time.process_time()

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COMPILE_EVENTS  # noqa: E402  (stdlib only at import: runs in every environment)

HIDDEN = [16, 16]


def compile_listener() -> dict:
    """Register a ``jax.monitoring`` listener that sums the trace + compile seconds into the returned dict; the
    share of NumPyro's per-step program (``fori_collect``'s ``_body_fn``, when its progress bar is on) apart."""
    import jax

    totals = {"seconds": 0.0, "count": 0, "loop_seconds": 0.0, "loop_count": 0}

    def listen(event, duration, fun_name=None, **kwargs):
        if event in COMPILE_EVENTS:
            totals["seconds"] += duration
            totals["count"] += event == COMPILE_EVENTS[-1]
            if fun_name and "_body_fn" in fun_name:
                totals["loop_seconds"] += duration
                totals["loop_count"] += event == COMPILE_EVENTS[-1]

    jax.monitoring.register_event_duration_secs_listener(listen)
    return totals


def fit_clock() -> dict:
    return {"fit_wall": time.perf_counter() - _START_WALL, "fit_cpu": time.process_time() - _START_CPU}


def authors_config(args: dict) -> Path:
    """The authors' ``replicate_uci/mclmc.yaml`` with this run's data path, budget, chains and seed, written to
    ``WORKDIR/config.yaml``."""
    import yaml

    checkout, work = Path(args["checkout"]).resolve(), Path(args["workdir"]).resolve()
    sys.path.insert(0, str(checkout))
    os.chdir(work)
    config = yaml.safe_load((checkout / "experiments" / "replicate_uci" / "mclmc.yaml").read_text())
    config["saving_dir"] = str(work / "results")
    config["experiment_name"] = f"mclmc_seed{args['seed']}"
    config["data"]["path"] = str(checkout / "data" / f"{args.get('data', 'airfoil')}.data")
    config["rng"] = int(args["seed"])
    config["logging"] = True
    sampler = config["training"]["sampler"]
    sampler.update(
        warmup_steps=args["warmup"], n_chains=args["chains"], n_samples=args["samples"], n_thinning=args["thinning"]
    )
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    return work / "config.yaml"


def split(args: dict) -> dict:
    """The authors' data loader's split for this seed, saved to ``WORKDIR/split.npz`` (train/valid/test x/y)."""
    path = authors_config(args)
    import numpy as np
    from src.config.core import Config
    from src.dataset import TabularLoader

    cfg = Config.from_file(path)
    loader = TabularLoader(config=cfg.data, rng=cfg.jax_rng, target_len=cfg.data.target_len)
    np.savez(
        path.parent / "split.npz",
        **{
            f"{part}_{xy}": np.asarray(getattr(loader, f"{part}_{xy}"))
            for part in ("train", "valid", "test")
            for xy in ("x", "y")
        },
    )
    return {}


def authors(args: dict) -> dict:
    work = authors_config(args).parent
    compiled = compile_listener()
    import train  # their train.py; its command line runs only under __main__
    from src.config.core import Config
    from src.training.trainer import BDETrainer

    BDETrainer.generate_html_report = lambda self: None  # the report notebook is not part of the fit
    cfg = Config.from_file(work / "config.yaml")
    train.train_bde(cfg, int(args["devices"]))
    out = fit_clock()
    # their ``measure_time`` logs "time.<phase> took <seconds> seconds." into the experiment's training.log
    phases = dict(re.findall(r"time\.(\w+) took ([0-9.]+) seconds", (cfg.experiment_dir / "training.log").read_text()))
    out.update(
        compile_s=compiled["seconds"],
        compiles=compiled["count"],
        ensemble_s=float(phases["warmstart"]),
        sampler_s=float(phases["sampling"]),
    )

    import jax.numpy as jnp
    import numpy as np
    from src.dataset import TabularLoader
    from src.inference.evaluation import predict_bde
    from src.training.utils import load_samples_from_dir

    loader = TabularLoader(config=cfg.data, rng=cfg.jax_rng, target_len=cfg.data.target_len)
    samples = load_samples_from_dir(cfg.experiment_dir / "samples", tree_path=cfg.experiment_dir / "tree")
    raw = predict_bde(samples, cfg.get_flax_model(), loader.test_x, loader.test_y, batch_size=None, verbose=False)
    raw = np.asarray(raw).reshape(-1, raw.shape[-2], 2)  # (chains * draws, n_test, 2)
    np.savez(
        work / "predictions.npz",
        mu=raw[..., 0],
        sigma=np.asarray(jnp.exp(raw[..., 1]).clip(1e-6, 1e6)),
        y=np.asarray(loader.test_y),
    )
    out["devices_used"] = len(__import__("jax").devices())
    return out


def bde(args: dict) -> dict:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(args['devices'])}"
    import numpy as np

    compiled = compile_listener()
    import jax
    from bde import BdeRegressor
    from bde.loss import GaussianNLL

    split = np.load(args["split"])
    x, y = split["train_x"], split["train_y"]
    regressor = BdeRegressor(
        hidden_layers=HIDDEN,
        n_members=int(args["chains"]),
        seed=int(args["seed"]),
        loss=GaussianNLL(),
        epochs=500,
        patience=10,
        validation_split=len(split["valid_y"]) / len(y),
        lr=1e-3,
        weight_decay=1e-3,
        warmup_steps=int(args["warmup"]),
        n_samples=int(args["samples"]),
        n_thinning=int(args["thinning"]),
    )
    build_log_post, marks = regressor._build_log_post, []

    def ensemble_done(*a, **k):  # ``fit`` calls it right after training the members
        marks.append(time.perf_counter())
        return build_log_post(*a, **k)

    regressor._build_log_post = ensemble_done
    fit_start = time.perf_counter()
    regressor.fit(x=jax.numpy.asarray(x), y=jax.numpy.asarray(y))
    jax.block_until_ready(regressor.positions_eT_)
    out = fit_clock()
    out.update(
        compile_s=compiled["seconds"],
        compiles=compiled["count"],
        ensemble_s=marks[0] - fit_start,
        sampler_s=time.perf_counter() - marks[0],
    )

    raw = np.asarray(regressor.predict(jax.numpy.asarray(split["test_x"]), raw=True))
    raw = raw.reshape(-1, raw.shape[-2], 2)  # (members * draws, n_test, 2)
    np.savez(
        Path(args["workdir"]) / "predictions.npz",
        mu=raw[..., 0],
        sigma=np.asarray(jax.nn.softplus(raw[..., 1]) + 1e-6),
        y=split["test_y"],
    )
    out["devices_used"] = len(jax.devices())
    return out


def ours(args: dict) -> dict:
    import numpyro

    numpyro.set_host_device_count(int(args["devices"]))  # NumPyro's advice, before JAX starts
    import numpy as np

    compiled = compile_listener()
    import jax
    from numpyro.infer import MCMC, Predictive

    from numpyro_mile import MILE
    from numpyro_mile.models import mlp_regression

    split = np.load(args["split"])
    init_params = authors_members(args["init_from"]) if args.get("init_from") else None
    if args.get("init_npz"):
        init_params = {k: np.asarray(v) for k, v in np.load(args["init_npz"]).items()}
    kernel = MILE(mlp_regression, ensemble_options=dict(validation=(split["valid_x"], split["valid_y"])))
    mcmc = MCMC(
        kernel,
        num_warmup=int(args["warmup"]),
        num_samples=int(args["samples"]),
        thinning=int(args["thinning"]),
        num_chains=int(args["chains"]),
        chain_method="vectorized",
    )
    if args.get("progress_bar") is not None:
        mcmc.progress_bar = bool(args["progress_bar"])
    run_start = time.perf_counter()
    mcmc.run(
        jax.random.PRNGKey(int(args["seed"]) + int(args.get("key_offset", 0))),
        split["train_x"],
        split["train_y"],
        hidden=tuple(HIDDEN),
        init_params=init_params,
    )
    samples = jax.block_until_ready(mcmc.get_samples())
    out = fit_clock()
    ensemble_s = kernel.ensembles[-1].fit_seconds if kernel.ensembles else 0.0
    if kernel.ensembles:  # the members, for the authors' sampler from our ensemble (``authors_sampler``)
        np.savez(
            Path(args["workdir"]) / "ensemble.npz",
            **{k: np.asarray(v) for k, v in kernel.ensembles[-1].init_params.items()},
        )
    out.update(
        compile_s=compiled["seconds"],
        compiles=compiled["count"],
        loop_compile_s=compiled["loop_seconds"],
        loop_compiles=compiled["loop_count"],
        ensemble_s=ensemble_s,
        sampler_s=time.perf_counter() - run_start - ensemble_s,
    )

    pred = Predictive(mlp_regression, samples, return_sites=["mu", "sigma"])(
        jax.random.PRNGKey(0), split["test_x"], hidden=tuple(HIDDEN)
    )
    np.savez(
        Path(args["workdir"]) / "predictions.npz",
        mu=np.asarray(pred["mu"]),
        sigma=np.asarray(pred["sigma"]),
        y=split["test_y"],
    )
    out["devices_used"] = len(jax.devices())
    return out


def authors_members(folder: str) -> dict:
    """The authors' deep ensemble of a run (their warmstart ``params_<member>.npz`` files in ``folder``) as
    ``mlp_regression``'s ``init_params``: ``w<i>``/``b<i>`` with a leading member axis."""
    import numpy as np

    files = sorted(Path(folder).glob("params_*.npz"), key=lambda f: int(f.stem.split("_")[1]))
    members = [np.load(f) for f in files]
    return {
        f"{short}{i}": np.stack([m[f"fcn.layer{i}.{long}"] for m in members])
        for i in range(len(HIDDEN) + 1)
        for short, long in (("w", "kernel"), ("b", "bias"))
    }


def authors_sampler(args: dict) -> dict:
    """The authors' tuning and sampling code started from numpyro_mile's deep ensemble of the same seed
    (``ARGS["init"]``, saved by the ``ours`` run): their trainer's log posterior (network, prior, likelihood,
    training rows), their ``custom_mclmc_warmup`` with their config's settings, then BlackJAX's MCLMC at the tuned
    step size and L for the sampling steps, thinned; the chains vmapped on one device (its times are not a
    user's run and are not compared)."""
    work = authors_config(args).parent
    compiled = compile_listener()
    import blackjax
    import jax
    import jax.numpy as jnp
    import numpy as np
    from src.config.core import Config
    from src.training.trainer import BDETrainer
    from src.training.warmup import custom_mclmc_warmup

    cfg = Config.from_file(work / "config.yaml")
    trainer, s = BDETrainer(cfg), cfg.training.sampler
    loader = trainer.loader

    def log_post(position):
        return trainer.prob_model.log_unnormalized_posterior(position, x=loader.train_x, y=loader.train_y)

    members = np.load(args["init"])
    init = {
        "fcn": {
            f"layer{i}": {"kernel": jnp.asarray(members[f"w{i}"]), "bias": jnp.asarray(members[f"b{i}"])}
            for i in range(len(HIDDEN) + 1)
        }
    }
    warmup = custom_mclmc_warmup(
        log_post,
        diagonal_preconditioning=s.diagonal_preconditioning,
        desired_energy_var_start=s.desired_energy_var_start,
        desired_energy_var_end=s.desired_energy_var_end,
        trust_in_estimate=s.trust_in_estimate,
        num_effective_samples=s.num_effective_samples,
        step_size_init=s.step_size_init,
    )
    thin = int(args["thinning"])

    def chain(key, position):
        warm_key, sample_key = jax.random.split(key)
        state, params = warmup.run(warm_key, position, int(args["warmup"]))
        sampler = blackjax.mclmc(log_post, L=params.L, step_size=params.step_size)

        def one(state, step_key):
            state, _ = sampler.step(step_key, state)
            return state, state.position

        _, draws = jax.lax.scan(one, state, jax.random.split(sample_key, int(args["samples"])))
        return jax.tree_util.tree_map(lambda d: d[thin - 1 :: thin], draws), params.step_size, params.L

    keys = jax.random.split(jax.random.PRNGKey(int(args["seed"])), int(args["chains"]))
    draws, step_size, L = jax.block_until_ready(jax.jit(jax.vmap(chain))(keys, init))
    out = fit_clock()
    out.update(
        compile_s=compiled["seconds"],
        compiles=compiled["count"],
        ensemble_s=0.0,
        sampler_s=out["fit_wall"],
        step_size=float(jnp.mean(step_size)),
        L=float(jnp.mean(L)),
    )
    module = cfg.get_flax_model()
    flat = jax.tree_util.tree_map(lambda d: d.reshape((-1,) + d.shape[2:]), draws)
    raw = np.asarray(jax.vmap(lambda p: module.apply({"params": p}, loader.test_x))(flat))
    np.savez(
        work / "predictions.npz",
        mu=raw[..., 0],
        sigma=np.asarray(jnp.exp(raw[..., 1]).clip(1e-6, 1e6)),
        y=np.asarray(loader.test_y),
    )
    return out


def estimator_data(args: dict):
    """The task's rows as ``benchmarks/estimators.py`` saved them (raw units), and whether it is regression."""
    import numpy as np

    data = np.load(args["rows"])
    return data, args["task"] == "regression"


def bde_estimator(args: dict) -> dict:
    """``BdeRegressor`` / ``BdeClassifier`` as a tabular user runs them: features (and regression targets)
    standardised with training statistics first, as bde's examples do, its README's ``XLA_FLAGS`` for the cores."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(args['devices'])}"
    import numpy as np

    compiled = compile_listener()
    import jax
    from bde import BdeClassifier, BdeRegressor

    data, regression = estimator_data(args)
    x_mean, x_std = data["train_x"].mean(0), data["train_x"].std(0) + 1e-12
    y = data["train_y"]
    y_mean, y_std = (y.mean(), y.std()) if regression else (0.0, 1.0)
    settings = dict(
        hidden_layers=HIDDEN,
        n_members=int(args["chains"]),
        seed=int(args["seed"]),
        epochs=500,
        patience=10,
        validation_split=0.1,
        lr=1e-3,
        weight_decay=1e-3,
        warmup_steps=int(args["warmup"]),
        n_samples=int(args["samples"]),
        n_thinning=int(args["thinning"]),
    )
    estimator = (BdeRegressor if regression else BdeClassifier)(**settings)
    estimator.fit(
        jax.numpy.asarray((data["train_x"] - x_mean) / x_std),
        jax.numpy.asarray((y - y_mean) / y_std if regression else y),
    )
    jax.block_until_ready(estimator.positions_eT_)
    out = fit_clock()
    out.update(compile_s=compiled["seconds"], compiles=compiled["count"])

    raw = np.asarray(estimator.predict(jax.numpy.asarray((data["test_x"] - x_mean) / x_std), raw=True))
    raw = raw.reshape((-1,) + raw.shape[-2:])  # (members * draws, n_test, outputs)
    if regression:
        draws = dict(mu=raw[..., 0] * y_std + y_mean, sigma=(np.asarray(jax.nn.softplus(raw[..., 1])) + 1e-6) * y_std)
    else:
        draws = dict(proba=np.asarray(jax.nn.softmax(raw, axis=-1)), classes=np.asarray(estimator.classes_))
    np.savez(Path(args["workdir"]) / "predictions.npz", **draws)
    out["devices_used"] = len(jax.devices())
    return out


def ours_estimator(args: dict) -> dict:
    """``MILERegressor`` / ``MILEClassifier`` as the guide writes them: raw data in (scaling is inside), NumPyro's
    ``set_host_device_count`` for the cores, progress bars on."""
    import numpyro

    numpyro.set_host_device_count(int(args["devices"]))
    import numpy as np

    compiled = compile_listener()
    import jax

    from numpyro_mile import MILEClassifier, MILERegressor

    data, regression = estimator_data(args)
    estimator = (MILERegressor if regression else MILEClassifier)(
        num_chains=int(args["chains"]),
        num_warmup=int(args["warmup"]),
        num_samples=int(args["samples"]),
        thinning=int(args["thinning"]),
        random_state=int(args["seed"]),
    )
    estimator.fit(data["train_x"], data["train_y"])
    out = fit_clock()
    out.update(compile_s=compiled["seconds"], compiles=compiled["count"])
    draws = estimator.predict_draws(data["test_x"])
    if not regression:
        draws["classes"] = estimator.classes_
    function = estimator.function_diagnostics(data["test_x"])[0]  # mu / logits at the held-out rows
    out.update(fn_crhat=float(function["crhat"]), fn_ess_per_chain=float(function["ess_per_chain"]))
    np.savez(Path(args["workdir"]) / "predictions.npz", **draws)
    out["devices_used"] = len(jax.devices())
    return out


if __name__ == "__main__":
    which, path = sys.argv[1], sys.argv[2]
    result = {
        "split": split,
        "authors": authors,
        "bde": bde,
        "ours": ours,
        "authors_sampler": authors_sampler,
        "bde_estimator": bde_estimator,
        "ours_estimator": ours_estimator,
    }[which](json.loads(Path(path).read_text()))
    print("RESULT " + json.dumps(result), flush=True)
