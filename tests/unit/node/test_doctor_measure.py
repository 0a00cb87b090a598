"""`doctor`'s step measurement: real steps whose rounds decode the others' packets too."""

from __future__ import annotations

from distronet.node.backends import pick_backend
from distronet.node.daemon.parts import optimizer_config
from distronet.node.doctor.cli import local_model
from distronet.node.doctor.measure import MAX_GHOSTS, measure_steps, node_batch
from distronet.node.doctor.verdict import StepPlan
from distronet.node.models.spec import ModelSpec


def test_each_timed_round_counts_the_others_packets_and_the_figures_are_the_runs(
    one_torch_thread: None,
) -> None:
    spec = local_model("gpt", 2, 16)
    st = measure_steps(
        spec, optimizer_config("t", {}), pick_backend("cpu"), StepPlan(1, 2), peers=3, source="local"
    )
    assert st.decoded_peers == 3  # the last round accepted the three others' packets besides ours
    assert len(st.times_s) == 2 and min(st.times_s) > 0 and st.warmup == 1
    assert (st.batch, st.seq_len, st.params) == (2, 16, 875_264)
    assert 10_000 < st.packet_bytes < 40_000 and st.fits and st.peak_kind == "process RSS"
    many = measure_steps(
        spec, optimizer_config("t", {}), pick_backend("cpu"), StepPlan(0, 1), peers=50, source="x"
    )
    assert many.decoded_peers == MAX_GHOSTS


def test_a_global_batch_run_trains_this_nodes_share() -> None:
    spec = ModelSpec.from_run({"arch": "gpt", "batch": 4, "global_batch": 16})
    assert node_batch(spec, 3) == 4 and node_batch(spec, 0) == 16 and node_batch(spec, 4) == 4
    assert node_batch(ModelSpec.from_run({"arch": "gpt", "batch": 6}), 9) == 6
