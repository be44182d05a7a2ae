"""How much memory a simulated run needs, said before it starts, and what a process tree really uses.

:func:`estimate` adds up what ``fedpers run`` holds at its peak in Flower's Ray simulation:

* Ray's own processes (GCS, raylet, dashboard and runtime-env agents, idle workers): a constant;
* the driver: a Python process with torch, Flower and Ray imported, the dataset (float32 NCHW, plus the
  concatenated copy of a ``joined`` index space; of generated data only the clients' sizes), the server's
  copies of the global test split and of Ds, one round's replies (the upload of every sampled client,
  encoded as it arrives and decoded for aggregation), a per-client index (Flower's node record and
  context, the server's node -> partition map: ``INDEX_PER_CLIENT`` bytes each, no model), and every
  client's persistent state held in ``context.state`` (none with ``client_state_spill``: then nothing but
  the index grows with the number of clients);
* every client actor (``floor(CPUs / client_cpus)``, at most one per client): the same process base, the
  dataset, and the splits of the last ``CLIENTS_KEPT`` clients it served (the largest ones, as an upper
  bound), copied to its device. With CUDA those copies and the models live on the GPU.

The constants were measured on this project's machine (2 cores, CPU torch wheel with CUDA libraries, flwr
1.42, Ray 2.x): peak PSS of a digits run (no data to speak of): driver 613 MB, each actor 665 MB, Ray's
processes 338 MB. A process-tree's real peak is read with :func:`tree_pss` (PSS: shared library pages
divided between the processes that map them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fedpers.apps.processes import descendants
from fedpers.core.federation import CLIENTS_KEPT
from fedpers.core.models import parameter_count
from fedpers.core.schema import clients_per_round

MB = 2**20
INDEX_PER_CLIENT = 20 * 2**10  # ours: a round figure above the measured growth (benchmarks/results/scale.md)
RAY_PROCESSES = 340 * MB
DRIVER_BASE = 615 * MB
ACTOR_BASE = 665 * MB
FLOAT = 4


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs on the host and on the GPU, with the parts they are made of."""

    host: int
    gpu: int
    actors: int
    parts: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the user: the total, and what in it grows with the number of clients."""
        gpu = f", GPU {self.gpu / 2**30:.1f} GiB" if self.gpu else ""
        driver = self.parts["driver"] + self.parts["client index (driver)"] + self.parts["client state (driver)"]
        state = self.parts["client state (driver)"]
        grows = (f"client state {state / 2**30:.1f} GiB" if state else "client state on disk") + \
            f", index {self.parts['client index (driver)'] / MB:.0f} MiB"
        return (f"memory estimate: host {self.host / 2**30:.1f} GiB{gpu} (driver {driver / 2**30:.1f} GiB, of "
                f"which grows with the clients: {grows}; {self.actors} client actors "
                f"{self.parts['per actor'] / 2**30:.1f} GiB each; Ray)")


def state_bytes_per_client(client_cls: type, model) -> int:
    """Persistent state one client keeps between rounds: its ``persistent_part`` plus the
    ``state_model_copies`` whole-model copies its method declares (EMA teachers, personal models, control
    variates)."""
    part = getattr(client_cls, "persistent_part", None)
    own = parameter_count(model, part) if part else 0
    return FLOAT * int(own + float(getattr(client_cls, "state_model_copies", 0.0)) * parameter_count(model, "all"))


def estimate(cfg, federation, client_cls: type, model, *, cpus: int | None = None) -> MemoryEstimate:
    """The peak memory of ``fedpers run`` with ``cfg`` (see the module docstring)."""
    dataset = federation.held_bytes()  # generated data (dataset: synthetic): the clients' sizes only
    p = federation.partition
    per_sample = federation.sample_bytes()
    val = p.val or [()] * len(p.train)
    sizes = sorted((len(t) + len(e) + len(v) for t, e, v in zip(p.train, p.test, val)), reverse=True)
    clients_data = per_sample * sum(sizes[:CLIENTS_KEPT])
    server_data = per_sample * (federation.global_test_size() + len(p.aux))
    model_bytes = FLOAT * sum(v.numel() for v in model.state_dict().values())
    cpus = cpus or os.cpu_count() or 1
    actors = max(1, min(federation.num_clients, int(cpus // max(cfg.client_cpus, 1e-9))))
    state = 0 if cfg.client_state_spill else federation.num_clients * state_bytes_per_client(client_cls, model)
    sampled = clients_per_round(cfg.fraction_fit, federation.num_clients)
    upload = FLOAT * parameter_count(model, client_cls.contract.upload_part) * len(client_cls.contract.upload)
    on_gpu = cfg.device != "cpu" and _cuda()
    # per actor: the model, a teacher or personal copy, the optimizer and gradients: about 4 model sizes
    actor_device = clients_data + 4 * model_bytes
    parts = {
        "ray processes": RAY_PROCESSES,
        "driver": DRIVER_BASE + dataset + (0 if on_gpu else server_data) + 2 * model_bytes
        + 2 * sampled * upload,
        "client index (driver)": INDEX_PER_CLIENT * federation.num_clients,
        "client state (driver)": state,
        "per actor": ACTOR_BASE + dataset + (0 if on_gpu else actor_device),
    }
    host = (parts["ray processes"] + parts["driver"] + parts["client index (driver)"] + state
            + actors * parts["per actor"])
    gpu = actors * actor_device + server_data + 2 * model_bytes if on_gpu else 0
    return MemoryEstimate(int(host), int(gpu), actors, {k: int(v) for k, v in parts.items()})


def available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --- measuring a process tree ---------------------------------------------------------------------------------
def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants (:func:`fedpers.apps.processes.descendants`)."""
    return [root, *descendants(root)]


def rss_pss(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in bytes (0, 0 when it has gone)."""
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        pss = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
                break
        return rss, pss
    except (OSError, ValueError):
        return 0, 0


def tree_pss(root: int) -> int:
    """Total PSS of ``root``'s process tree now, in bytes."""
    return sum(rss_pss(pid)[1] for pid in process_tree(root))
