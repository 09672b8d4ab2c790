"""The per-process peak of data-parallel steps (lib/memory/sharded.py, predict.py's strategy terms).

GPT-2 tiny keeps every sharded trace under a second; the child process that traces starts once per
predictor (about 2 s). Each test uses its own cache directory unless it says so.
"""

from __future__ import annotations

import textwrap

import pytest

from lib import config as kc
from lib.errors import PlanError
from lib.memory import MemoryPredictor, cache, fingerprint, parallel_key

CPU = {"device_type": "cpu", "precision": "fp32"}


@pytest.fixture(scope="module")
def gpt2_tiny(tmp_path_factory):
    return kc.make_defconfig("gpt2-tiny", [], out=tmp_path_factory.mktemp("sharded") / ".config")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One predictor (one tracing child) for the tests that only compare figures."""
    predictor = MemoryPredictor(cache_dir=tmp_path_factory.mktemp("sharded-cache"))
    yield predictor
    predictor.close()


@pytest.mark.slow  # the shared tracing child: 40 s of this file's quick-tier time
def test_sharded_parameters_are_split_over_the_processes(shared, gpt2_tiny):
    one = shared.trace(gpt2_tiny, batch=4, **CPU)
    whole = shared.trace(gpt2_tiny, batch=4, strategy="fsdp", world_size=1, **CPU)
    half = shared.trace(gpt2_tiny, batch=4, strategy="fsdp", world_size=2, **CPU)
    assert whole.breakdown["parameters"] == one.breakdown["parameters"]
    assert half.breakdown["parameters"] == pytest.approx(one.breakdown["parameters"] / 2, rel=0.01)
    assert half.breakdown["gradients"] == pytest.approx(one.breakdown["gradients"] / 2, rel=0.01)
    assert half.parameters == one.parameters  # the whole model's count, not a shard's
    # what sharding adds: a unit gathered while it runs, and the collectives' buffers
    assert half.breakdown["unsharded_parameters"] > 0 and half.breakdown["communication"] > 0
    assert sum(half.breakdown.values()) == half.peak_bytes


@pytest.mark.slow  # the shared tracing child: 40 s of this file's quick-tier time
def test_full_shard_needs_less_than_ddp_and_grad_op_more(shared, gpt2_tiny):
    peak = lambda strategy: shared.predict(gpt2_tiny, batch=8, strategy=strategy, world_size=4,  # noqa: E731
                                           **CPU).peak_bytes
    fsdp, grad_op, ddp = peak("fsdp"), peak("fsdp_grad_op"), peak("ddp")
    assert fsdp < ddp
    assert grad_op >= fsdp
    # HSDP on one machine shards over all of it: the same step as FSDP
    assert peak("hsdp") == pytest.approx(fsdp, rel=0.01)


@pytest.mark.slow  # the shared tracing child: 40 s of this file's quick-tier time
def test_ddp_adds_its_buckets_and_traces_a_replica(shared, gpt2_tiny):
    one = shared.predict(gpt2_tiny, batch=8, **CPU)
    ddp = shared.predict(gpt2_tiny, batch=8, strategy="ddp", world_size=2, **CPU)
    assert ddp.trace == one.trace  # the replica's step: the same cached trace
    assert ddp.overheads["ddp_buckets"] == one.trace.breakdown["parameters"]
    assert "ddp_flat_gradients" in ddp.overheads  # out-of-memory recovery is on by default
    assert ddp.peak_bytes >= one.peak_bytes + ddp.overheads["ddp_buckets"]
    assert "ddp_buckets" not in shared.predict(gpt2_tiny, batch=8, strategy="ddp", world_size=1, **CPU).overheads


@pytest.mark.slow  # a tracing child of its own
def test_second_call_hits_the_cache_and_survives_the_process(tmp_path, gpt2_tiny):
    first = MemoryPredictor(cache_dir=tmp_path)
    a = first.predict(gpt2_tiny, batch=4, strategy="fsdp", world_size=2, **CPU)
    traced = first.traces
    assert first.predict(gpt2_tiny, batch=4, strategy="fsdp", world_size=2, **CPU) == a
    assert first.traces == traced == 1
    first.close()
    second = MemoryPredictor(cache_dir=tmp_path)  # a new process: reads the JSON cache, starts no child
    assert second.predict(gpt2_tiny, batch=4, strategy="fsdp", world_size=2, **CPU).peak_bytes == a.peak_bytes
    assert second.traces == 0 and second._sharded is None
    assert second.cached_batches(gpt2_tiny, strategy="fsdp", world_size=2, **CPU) == [4]
    assert second.cached_batches(gpt2_tiny, **CPU) == []  # one process's traces are kept apart


def test_world_size_mesh_and_offload_change_the_key(gpt2_tiny):
    def key(strategy="fsdp", world_size=2, local=None, offload=False, device_type="cuda"):
        return fingerprint(gpt2_tiny, device_type=device_type, precision="bf16", gradient_checkpointing=False,
                           train=True, parallel=parallel_key(strategy, world_size, local, offload, device_type))[0]

    keys = {key(), key(world_size=4), key(world_size=8), key(strategy="fsdp_grad_op"), key(offload=True),
            key(strategy="hsdp", world_size=8, local=4), key(strategy="hsdp", world_size=8, local=2)}
    assert len(keys) == 7
    assert key(local=1) == key()  # FSDP's mesh spans every process wherever they run
    assert key(offload=True, device_type="cpu") == key(device_type="cpu")  # offload is CUDA's


def test_unsharded_fingerprint_is_unchanged(gpt2_tiny):
    kw = {"device_type": "cpu", "precision": "fp32", "gradient_checkpointing": False, "train": True}
    digest, contents = fingerprint(gpt2_tiny, **kw)
    for strategy in ("none", "ddp"):  # a replica's step: no parallel field, the same key as before
        assert parallel_key(strategy, 8, None, True, "cpu") is None
        assert fingerprint(gpt2_tiny, **kw, parallel=parallel_key(strategy, 8, None, True, "cpu"))[0] == digest
    # the fields the key had before sharded traces existed, and nothing else
    assert set(contents) == {"format", "torch", "code", "model", "device_type", "precision", "train",
                             "cpu_kernels", "gradient_checkpointing", "optimizer", "momentum", "weight_decay",
                             "grad_clip"}
    assert contents["format"] == 1
    # the sharded tracer's code is hashed into sharded keys only: editing it keeps one process's traces
    assert cache._code_hash(False) == contents["code"] != cache._code_hash(True)


@pytest.mark.slow  # the shared tracing child: 40 s of this file's quick-tier time
def test_cpu_offload_takes_the_sharded_state_off_the_device(shared, gpt2_tiny):
    kw = {"batch": 8, "device_type": "cuda", "precision": "bf16", "strategy": "fsdp", "world_size": 2}
    plain, offload = shared.predict(gpt2_tiny, **kw), shared.predict(gpt2_tiny, **kw, cpu_offload=True)
    b = offload.trace.breakdown
    assert offload.overheads["cpu_offload"] == -(b["parameters"] + b["gradients"] + b["optimizer_state"]) < 0
    assert offload.peak_bytes < plain.peak_bytes
    assert "cpu_offload" not in plain.overheads


@pytest.mark.slow  # the shared tracing child: 40 s of this file's quick-tier time
def test_planner_keywords_on_curve_and_predict(shared, gpt2_tiny):
    kw = {"device_type": "cuda", "precision": "bf16", "compile_mode": None, "strategy": "fsdp", "world_size": 2,
          "local_world_size": 2, "cpu_offload": False}
    curve = shared.curve(gpt2_tiny, **kw)
    one = curve.prediction(1)
    cap = curve.largest_fitting(one.peak_bytes * 2, 64)
    assert 1 <= cap <= 64 and curve.at(cap) <= one.peak_bytes * 2
    prediction = shared.predict(gpt2_tiny, batch=cap, **kw)
    assert prediction.peak_bytes == curve.at(cap) and prediction.strategy == "fsdp"
    evaluate = shared.curve(gpt2_tiny, **kw, train=False, plus=1000)
    assert evaluate.prediction(4).trace.breakdown["gradients"] == 0
    with pytest.raises(ValueError, match="unknown strategy"):
        shared.predict(gpt2_tiny, batch=1, device_type="cpu", precision="fp32", strategy="zero3")


FAILING_FACTORY = textwrap.dedent('''
    import os

    def build():
        raise RuntimeError("the factory refuses\\non two lines")

    def die():
        os._exit(7)
''')


@pytest.mark.slow  # a tracing child of its own
def test_a_failure_in_the_child_is_a_plan_error(tmp_path, gpt2_tiny, monkeypatch):
    (tmp_path / "sharded_failing_factory.py").write_text(FAILING_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))  # the child gets this process's sys.path
    custom = kc.make_defconfig("custom-transformer", out=tmp_path / "custom.config")
    predictor = MemoryPredictor(cache_dir=tmp_path)
    try:
        refuses = kc.derive(custom, {"CUSTOM_MODEL_FACTORY": "sharded_failing_factory:build"})
        with pytest.raises(PlanError) as err:
            predictor.predict(refuses, batch=2, strategy="fsdp", world_size=2, **CPU)
        message = str(err.value)
        assert "RuntimeError: the factory refuses on two lines" in message and "fsdp at 2 processes" in message
        assert "Traceback" not in message and "\n" not in message
        dies = kc.derive(custom, {"CUSTOM_MODEL_FACTORY": "sharded_failing_factory:die"})
        with pytest.raises(PlanError, match=r"died \(exit status 7: no output\)"):
            predictor.predict(dies, batch=2, strategy="fsdp", world_size=2, **CPU)
        # a new child starts for the next trace
        assert predictor.predict(gpt2_tiny, batch=2, strategy="fsdp", world_size=2, **CPU).peak_bytes > 0
        assert predictor.traces == 1
    finally:
        predictor.close()


@pytest.mark.slow
def test_predicted_per_process_peak_matches_two_real_fsdp_processes(shared, gpt2_tiny, tmp_path):
    """The bench's instrument (each rank's RSS growth under torchrun, gloo) against the prediction: within the
    bench's bound of 5%, and never under by more than 2% (the direction that runs out of memory)."""
    from scripts.bench_memory import measure_sharded

    predicted = shared.predict(gpt2_tiny, batch=16, **CPU, strategy="fsdp", world_size=2).peak_bytes
    measured = measure_sharded(gpt2_tiny, tmp_path, "fsdp", 2, 16, "fp32")
    error = (predicted - measured["measured"]) / measured["measured"]
    assert len(measured["ranks"]) == 2 and -0.02 <= error <= 0.05, (predicted, measured)


@pytest.mark.slow  # three tracing children
def test_traces_taken_at_once_are_the_traces_taken_one_by_one(tmp_path, gpt2_tiny):
    """ShardedTracers.trace_all hands each request to a child of its own and reads the replies in order: the
    same Traces as one child tracing them in turn (one process's step too), and a failing request is a
    PlanError that leaves the tracers ready for the next."""
    from lib.memory.sharded_process import ShardedTracer, ShardedTracers

    step = dict(batch=2, gradient_checkpointing=False, train=True, **CPU)
    sharded = dict(step, strategy="fsdp", world_size=2, local_world_size=2, cpu_offload=False)
    requests = [(gpt2_tiny, sharded), (gpt2_tiny, dict(sharded, batch=4)), (gpt2_tiny, step)]
    one, two = ShardedTracer(), ShardedTracers(2)
    try:
        alone = [one.trace(config, **kw) for config, kw in requests]
        together = two.trace_all(requests)

        def figures(trace):  # all but how long the trace took
            return {k: v for k, v in trace.to_json().items() if k != "seconds"}
        assert [figures(t) for t in together] == [figures(t) for t in alone]
        assert alone[0].peak_bytes != alone[1].peak_bytes
        with pytest.raises(PlanError):
            two.trace_all([(gpt2_tiny, dict(sharded, strategy="no-such-strategy")), requests[1]])
        assert figures(two.trace_all(requests[:2])[1]) == figures(alone[1])
    finally:
        one.close()
        two.close()
