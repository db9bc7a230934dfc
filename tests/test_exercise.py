import torch

from hwlab import exercise as X


def ref(x):
    return x * 2


def make():
    return (torch.randn(100),)


def test_not_done_yet_is_not_an_error():
    def todo(x):
        raise NotImplementedError
    r = X.check_kernel("double", todo, ref, make, tol=1e-6, n_bytes=800)
    assert r.status == "not done yet" and not r.passed
    assert X.check_kernel("double", lambda x: None, ref, make, tol=1e-6, n_bytes=800).status == "not done yet"


def test_wrong_answer_is_caught_on_fresh_data():
    calls = []

    def sometimes_wrong(x):
        calls.append(1)
        return x * 2 if len(calls) < 2 else x * 2 + 1  # right once, wrong on the next input
    r = X.check_kernel("double", sometimes_wrong, ref, make, tol=1e-6, n_bytes=800)
    assert r.status == "wrong" and "relative error" in r.message


def test_correct_on_cpu_is_graded_for_correctness_only():
    r = X.check_kernel("double", lambda x: x + x, ref, make, tol=1e-6, n_bytes=800,
                       ceiling_gbps=1000.0, device="cpu")
    assert r.passed and r.status == "passed (correctness only)" and "GPU" in r.message


def test_check_value():
    assert X.check_value("leaf", None, "G", "").status == "not done yet"
    assert X.check_value("leaf", "G", "G", "why").passed
    w = X.check_value("leaf", "J", "G", "DRAM is saturated")
    assert w.status == "wrong" and "'J'" in w.message
