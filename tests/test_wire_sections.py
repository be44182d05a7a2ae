"""The arrays of a message travel in named sections (fedpers.core.wire), checked on both ends."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from hypothesis import given
from hypothesis import strategies as st

from clients.scaffold import ScaffoldClient
from fedpers.registry.config import build_config
from fedpers.core.errors import ClientUpdateError
from fedpers.core.federation import get_federation
from fedpers.core.wire import SectionError, join_sections, section_counts_of, split_sections
from strategies.scaffold import ScaffoldStrategy
from tests.conftest import make_context, tiny_overrides



def arrays(n, value=0.0):
    return [np.full(2, value + i, np.float32) for i in range(n)]


def test_join_then_split_gives_each_section_by_name():
    sent, counts = join_sections({"b": arrays(1, 10), "model": arrays(3)}, ("model", "b"))
    assert counts == {"arrays:model": 3, "arrays:b": 1}
    assert [a[0] for a in sent] == [0.0, 1.0, 2.0, 10.0]  # the declared order, not the dict's
    got = split_sections(sent, {"server_round": 2, **counts}, ("model", "b"))
    assert [a[0] for a in got["model"]] == [0.0, 1.0, 2.0] and [a[0] for a in got["b"]] == [10.0]
    assert section_counts_of({"server_round": 2, **counts}) == counts


@given(sizes=st.lists(st.integers(0, 4), min_size=1, max_size=4))
def test_any_sections_round_trip(sizes):
    names = tuple(f"s{i}" for i in range(len(sizes)))
    content = {name: arrays(k, 10.0 * i) for i, (name, k) in enumerate(zip(names, sizes))}
    sent, counts = join_sections(content, names)
    got = split_sections(sent, counts, names)
    assert {n: [a.tolist() for a in v] for n, v in got.items()} == {n: [a.tolist() for a in v] for n, v in content.items()}


def test_a_message_that_is_not_the_declared_sections_is_refused_naming_what_differs():
    names = ("model", "control_delta")
    sent, counts = join_sections({"model": arrays(2), "control_delta": arrays(2)}, names)
    with pytest.raises(SectionError, match=r"sections \['control', 'model'\] received, but the method declares "
                                           r"\['model', 'control_delta'\]"):
        split_sections(sent, {"arrays:model": 2, "arrays:control": 2}, names)
    with pytest.raises(SectionError, match=r"4 arrays received, but the sections count model=2, control_delta=1"):
        split_sections(sent, {**counts, "arrays:control_delta": 1}, names)
    with pytest.raises(SectionError, match=r"section 'model': array count -1"):
        split_sections(sent, {**counts, "arrays:model": -1}, names)
    with pytest.raises(SectionError, match=r"sections \[\] received"):
        split_sections(sent, {}, names)  # two sections need their counts
    assert len(split_sections(sent, {}, ("model",))["model"]) == 4  # one section: all arrays are it
    with pytest.raises(SectionError, match=r"sections \['model'\] sent, but the method declares"):
        join_sections({"model": arrays(1)}, names)  # the sender's own check


def scaffold_pair():
    cfg = build_config(tiny_overrides(method="scaffold", aux_size=0))
    strategy = ScaffoldStrategy(cfg, get_federation(cfg))
    return cfg, strategy


def test_a_scaffold_client_refuses_a_broadcast_without_its_control_variate_section():
    cfg, strategy = scaffold_pair()
    params = strategy.download_arrays()
    config = strategy.message_config(1)
    assert config["arrays:model"] == config["arrays:server_control"] == len(params) // 2
    client = ScaffoldClient(cfg, make_context(0, cfg.num_clients))
    bad = {k: v for k, v in config.items() if k != "arrays:server_control"}
    with pytest.raises(ClientUpdateError, match=r"client 0: server broadcast: sections \['model'\] received"):
        client.fit(params, bad)


def test_the_server_rejects_an_upload_whose_sections_are_not_declared_or_miscounted():
    cfg, strategy = scaffold_pair()
    params = strategy.download_arrays()
    up, n, metrics = ScaffoldClient(cfg, make_context(0, cfg.num_clients)).fit(params, strategy.message_config(1))

    class Proxy:
        cid = "node-0"

    def rejected(metrics_sent, uploaded=up):
        strategy.book.start()
        strategy.roster.partition_of = {"node-0": 0}
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(uploaded), n, metrics_sent)
        try:
            strategy.aggregate_fit(1, [(Proxy(), res)], [])
        except Exception:  # noqa: BLE001 - fewer than min_fit_updates valid updates
            pass
        return strategy.book.current["rejected"]

    assert rejected(metrics) == 0  # as sent: aggregated
    half = len(up) // 2
    assert rejected({**metrics, "arrays:model": half - 1, "arrays:control_delta": half + 1}) == 1  # wrong shapes
    assert rejected({k: v for k, v in metrics.items() if k != "arrays:control_delta"}) == 1  # a section missing
    assert rejected({**metrics, "arrays:extra": 0}) == 1  # an undeclared section


def test_a_fedproc_client_refuses_sections_that_hold_the_wrong_number_of_arrays():
    from clients.fedproc import FedProcClient
    from strategies.fedproc import FedProcStrategy

    cfg = build_config(tiny_overrides(method="fedproc", aux_size=0))
    strategy = FedProcStrategy(cfg, get_federation(cfg))
    params = strategy.download_arrays()
    config = strategy.message_config(1)
    moved = {**config, "arrays:global_prototypes": 2, "arrays:prototype_mask": 0}  # same total, wrong split
    with pytest.raises(ClientUpdateError, match="client 0: server broadcast: expected one prototypes and one mask"):
        FedProcClient(cfg, make_context(0, cfg.num_clients)).fit(params, moved)
