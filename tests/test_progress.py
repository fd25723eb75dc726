"""Progress bars: in place on a terminal, a bounded number of lines in a log."""

import io
import itertools

import jax
import pytest
import tqdm.std

from numpyro_mile import _progress, deep_ensemble
from numpyro_mile.datasets import toy_regression
from numpyro_mile.models import mlp_regression


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def slow_clock(monkeypatch):
    """tqdm's clock made to advance a second at every reading: every update looks slow enough for a redraw."""
    ticks = itertools.count()
    monkeypatch.setattr(tqdm.std, "time", lambda: float(next(ticks)))


def redraws(text: str) -> int:
    """Lines a log viewer shows: tqdm starts every redraw with a carriage return."""
    return len([part for part in text.replace("\n", "\r").split("\r") if part.strip()])


def test_a_bar_written_to_a_log_redraws_a_bounded_number_of_times(slow_clock):
    log = io.StringIO()
    with _progress.progress_bar(10_000, desc="sample", file=log) as bar:
        for _ in range(10_000):
            bar.update(1)
    assert redraws(log.getvalue()) <= _progress.LOG_REDRAWS + 2
    assert "10000/10000" in log.getvalue()  # the last line says where it ended
    with _progress.progress_bar(100, file=Terminal()) as bar:  # a terminal: tqdm's own pace
        assert bar.dynamic_miniters and bar.mininterval == 0.1


def test_the_deep_ensembles_bar_in_a_log_is_a_few_lines(capfd, monkeypatch, slow_clock):
    """Pretraining over 300 (slow-looking) epochs, stderr captured (not a terminal): a handful of lines, not one
    per epoch."""
    monkeypatch.delenv("CI", raising=False)  # the ensemble's bar is off under CI
    X, y = toy_regression(64)
    deep_ensemble(mlp_regression, jax.random.PRNGKey(0), 2, X, y, max_epochs=300, hidden=(4,))
    err = capfd.readouterr().err
    assert "deep ensemble" in err
    assert redraws(err) <= _progress.LOG_REDRAWS + 2, err[-2000:]


def test_run_chunkeds_bar_in_a_log_is_a_few_lines(capfd, slow_clock, tmp_path):
    """``run_chunked`` with NumPyro's progress bar on, 40 chunks, stderr captured: a handful of lines."""
    from numpyro.infer import MCMC

    from numpyro_mile import SGLD, run_chunked

    X, y = toy_regression(64)
    mcmc = MCMC(SGLD(mlp_regression, 1e-4), num_warmup=200, num_samples=200, num_chains=2, chain_method="vectorized")
    mcmc.progress_bar = True  # NumPyro turns its bar off under CI and pytest-xdist; a user's run has it on
    run_chunked(
        mcmc, jax.random.PRNGKey(0), X, y, hidden=(4,), subsample_size=16, checkpoint_path=tmp_path / "c", chunk_size=10
    )
    err = capfd.readouterr().err
    assert "400/400" in err
    assert redraws(err) <= _progress.LOG_REDRAWS + 2, err[-2000:]
