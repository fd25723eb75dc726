"""Running MCMC beyond one ``MCMC.run``: checkpoint files (:mod:`.checkpoint`), the chunked driver
that resumes a run bit for bit (:mod:`.chunked`; its draws go to :mod:`numpyro_mile.sample_store`)
and chains sharded over devices (:mod:`.distributed`). The public names are exported by
``numpyro_mile`` itself; this package imports nothing, so its modules load independently.
"""
