import os

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Ceiling caches go to a temporary folder, never the user's ~/.cache."""
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path / "cache"))
    yield


@pytest.fixture(autouse=True)
def _umask_kept():
    """Each test gets the session's umask back: a command run in-process that makes its outputs private
    (umask 077) must not make the next test's folders unreadable to the system users a hub test
    logs in as (a clean-clone run failed all three hub tests that way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(autouse=True)
def _machine_profile(monkeypatch):
    """HWLAB_TEST_MACHINE_PROFILE=other: the examination's last-level cache is the second profile's
    (tests/machine.py), so CI runs the verdict tests on a cache unlike this machine's."""
    if os.environ.get("HWLAB_TEST_MACHINE_PROFILE") == "other":
        from machine import machine_profiles

        import hwlab.examine as ex

        other = machine_profiles()[-1].cache_bytes
        monkeypatch.setattr(ex, "last_level_cache_bytes", lambda device: other if device.type == "cpu" else None)
    yield


def pytest_report_header(config):
    """The machine facts verdict tests depend on (tests/machine.py), beside every result."""
    from machine import facts

    return ["hwlab machine facts: " + "; ".join(f"{k}: {v}" for k, v in facts().items())]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The same facts after the results (``-q`` hides the header): a failure is read beside them."""
    from machine import facts

    terminalreporter.section("hwlab machine facts (verdicts depend on these)")
    for k, v in facts().items():
        terminalreporter.write_line(f"{k}: {v}")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with the device recipe)")
    for it in items:
        if "gpu" in it.keywords:
            it.add_marker(skip)
