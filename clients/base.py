"""Shared client side of every fedpers method: a Flower ``NumPyClient`` that

* finds its data by the SuperNode's ``partition-id`` (node config) and keeps it on the device,
* loads what the server broadcasts (``download_part``) after checking shapes and finiteness,
* keeps the method's persistent part (``persistent_part``, e.g. the private head) in ``context.state``
  across rounds, so it survives rounds in which the client is not sampled,
* trains with a method-specific mini-batch loss and uploads only ``upload_part``,
* evaluates its personalized model on its own test split.

Methods override :meth:`batch_loss`, :meth:`on_download` and :meth:`evaluate_personalized`.
Flower talks to :func:`message_client`, which also runs the evaluation a fit message carries.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from logging import INFO
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.client import Client, NumPyClient
from flwr.common import log

from fedpers.core import seeds
from fedpers.core.cluster import node_identity
from fedpers.core.errors import ClientUpdateError, ConfigError, NodeMismatchError
from fedpers.core.federation import get_federation
from fedpers.core.models import Part, build_model, get_arrays, model_kind_for, set_arrays
from fedpers.core.schema import Config, parse_id_list
from fedpers.core.state_store import ClientStateStore, config_fingerprint, state_dir_of
from fedpers.core.training import evaluate, resolve_device, seed_everything, sgd, train_epochs
from fedpers.core.validation import corrupt_update
from fedpers.core.wire import (MODEL_SECTION, VALIDATION_PREFIX, WHOLE_MODEL, Contract, ContractSide, SectionError,
                          carried_metrics, evaluate_round_of, join_sections, round_config, section_counts_of,
                          server_round_of, split_sections)

STATE_PREFIX = "fedpers."
ROUNDS_RECORD = "saved_rounds"  # context.state ConfigRecord: state name -> round it was saved in


def partition_id_of(context: Context, num_clients: int) -> int:
    """The client's partition id from the SuperNode's node config, checked against ``num_clients``."""
    node_config = context.node_config
    if "partition-id" not in node_config:
        raise NodeMismatchError(
            "node config has no 'partition-id': start the SuperNode with "
            "--node-config \"partition-id=N num-partitions=K\""
        )
    pid = int(node_config["partition-id"])
    total = int(node_config.get("num-partitions", num_clients))
    if total != num_clients:
        raise NodeMismatchError(f"node config num-partitions={total} but the run has num_clients={num_clients}")
    if not 0 <= pid < num_clients:
        raise NodeMismatchError(f"partition-id {pid} outside 0..{num_clients - 1}")
    return pid


def arrays_digest(arrays: Sequence[np.ndarray]) -> str:
    """Short content hash of a list of arrays (to check that persistent state is what was trained)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class FedPersClient(ContractSide, NumPyClient):
    """Base client: see module docstring."""

    # what the server broadcasts and this client uploads (model parts, named sections; read as
    # download_part, upload_part, ...): the method strategy's fedpers.core.wire.Contract (a test checks it)
    contract: Contract = WHOLE_MODEL
    persistent_part: Part | None = None
    # whole-model copies of other state a client keeps between rounds (EMA teacher, personal model,
    # control variates), besides persistent_part: what fedpers.apps.memory.estimate counts per client
    state_model_copies: float = 0.0
    model_kind: str = "cnn"  # as the method's strategy declares it (tests/test_layers.py checks they agree)

    def __init__(self, cfg: Config, context: Context):
        self.cfg = cfg
        self.context = context
        self.device = resolve_device(cfg.device)
        federation = get_federation(cfg)
        self.partition_id = partition_id_of(context, federation.num_clients)
        self.data = federation.client(self.partition_id, self.device)
        self.model = build_model(federation.input_shape, federation.num_classes, feature_dim=cfg.feature_dim,
                                 dropout=cfg.dropout, seed=cfg.seed,
                                 kind=model_kind_for(cfg.model_kind, self.model_kind, cfg.dataset)).to(self.device)
        self._faulty = set(parse_id_list(cfg.faulty_clients))
        self._server_round: int | None = None
        self._state_horizon: float = math.inf
        self._saved_now: set[str] = set()  # names saved while handling this message: always valid
        # Methods whose evaluated state is not the persistent part (Ditto's v_k, pFedMe's theta_k, FedALA's
        # local model, pFedSim's local model) set the digest of the state they evaluated here, in
        # evaluate_personalized: the server compares it with the one their last fit reported.
        self.evaluated_digest: str | None = None
        self.initialise_model()
        # The persistent part's initial value (phi_k^0): the seeded init, identical on every client.
        self._initial_personal = get_arrays(self.model, self.persistent_part) if self.persistent_part else None

    def initialise_model(self) -> None:
        """A method's own change to the freshly built model's init, before phi_k^0 is taken from it (none
        by default); it must draw only from ``cfg.seed`` so that every client starts alike."""

    # --- persistent per-client state ----------------------------------------------------------
    # Every saved version carries the round it was saved in. While a message of round t is handled, state
    # from round t - 1 or earlier is valid for fit and from round t or earlier for evaluate; a version from
    # a later round belongs to a round lost when the server stopped and is being run again after a resume,
    # so the version before it is used (kept by the on-disk store).
    def load_state(self, name: str) -> list[np.ndarray] | None:
        """Arrays saved under ``name`` in this client's state, or None if never saved.

        ``context.state`` first; when empty (e.g. the SuperNode restarted) or from a lost round, and a state
        directory is configured, the newest valid file written by :meth:`save_state` (then cached in
        ``context.state``). With ``client_state_spill`` only the file: nothing is cached in memory.
        """
        horizon = math.inf if name in self._saved_now else self._state_horizon
        if self.cfg.client_state_spill:  # on disk only: nothing cached in memory
            return self.state_store().load(name, max_round=horizon)
        record = self.context.state.get(STATE_PREFIX + name)
        saved_round = self._memory_rounds().get(name)
        if record is not None and (saved_round is None or saved_round <= horizon):
            return record.to_numpy_ndarrays()
        store = self.state_store()
        arrays = store.load(name, max_round=horizon) if store is not None else None
        if arrays is None and record is not None:
            raise ClientUpdateError(
                f"client {self.partition_id}: state '{name}' was saved in round {saved_round}, after the round "
                f"being run ({self._state_horizon + 1}), and no earlier version is on disk: set "
                "client_state_dir (or the node config's state-dir) for runs that resume")
        if arrays is not None:
            on_disk = store.saved_round(name)  # the current file's round; None when the previous one was used
            self._cache(name, arrays, on_disk if on_disk is not None and on_disk <= horizon else None)
            log(INFO, "fedpers: client %d restored state '%s' from %s", self.partition_id, name, store.path(name))
        return arrays

    def save_state(self, name: str, arrays: Sequence[np.ndarray]) -> None:
        """Save ``arrays`` under ``name`` in this client's state (kept across rounds), and atomically
        to the state directory when one is configured (kept across SuperNode restarts); with
        ``client_state_spill`` only to the state directory. Both record the round being run."""
        arrays = [np.asarray(a) for a in arrays]
        self._saved_now.add(name)
        if not self.cfg.client_state_spill:
            self._cache(name, arrays, self._server_round)
        store = self.state_store()
        if store is not None:
            store.save(name, arrays, server_round=self._server_round)

    def _memory_rounds(self) -> dict[str, int]:
        record = self.context.state.get(STATE_PREFIX + ROUNDS_RECORD)
        return {} if record is None else {k: int(v) for k, v in record.items()}

    def _cache(self, name: str, arrays: Sequence[np.ndarray], saved_round: int | None) -> None:
        self.context.state[STATE_PREFIX + name] = ArrayRecord(numpy_ndarrays=list(arrays))
        rounds = self._memory_rounds()
        if saved_round is None:
            rounds.pop(name, None)
        else:
            rounds[name] = int(saved_round)
        self.context.state[STATE_PREFIX + ROUNDS_RECORD] = ConfigRecord(rounds)

    def begin_message(self, server_round: int, *, training: bool) -> None:
        """Note the round of the message being handled: what state is valid (see above) and what round a
        save records. Called first by :meth:`fit` and :meth:`evaluate`."""
        self._server_round = server_round if server_round > 0 else None
        if server_round > 0:
            self._state_horizon = server_round - 1 if training else server_round

    def state_store(self) -> ClientStateStore | None:
        """This client's on-disk state (node config ``state-dir``, else ``client_state_dir``); None = memory only."""
        if "_state_store" not in self.__dict__:
            root = state_dir_of(self.context.node_config, self.cfg.client_state_dir)
            if self.cfg.client_state_spill and not root:
                raise ConfigError("config key 'client_state_spill': needs client_state_dir (fedpers run sets "
                                  "<out_dir>/client_state) or the node config's state-dir")
            self._state_store = (ClientStateStore(root, self.partition_id, config_fingerprint(self.cfg))
                                 if root else None)
        return self._state_store

    def personal_arrays(self) -> list[np.ndarray] | None:
        """The persistent part as last saved (or its initial value); None for methods without one."""
        if not self.persistent_part:
            return None
        stored = self.load_state("personal")
        return stored if stored is not None else self._initial_personal

    # --- round mechanics --------------------------------------------------------------------------
    def receive(self, parameters: list[np.ndarray], config: dict[str, Any]) -> None:
        """Split a broadcast into its declared sections (``self.received``, by name) by the counts in its
        config, then :meth:`prepare` with its model section."""
        try:
            self.received = split_sections(list(parameters), config, self.broadcast_sections)
        except SectionError as exc:
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: {exc}") from None
        self.prepare(self.received.get(MODEL_SECTION, []))

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Load the broadcast, let the method snapshot it, then restore the persistent part."""
        set_arrays(self.model, parameters, self.download_part,
                   source=f"client {self.partition_id}: server broadcast")
        self.on_download()
        personal = self.personal_arrays()
        if personal is not None:
            set_arrays(self.model, personal, self.persistent_part, source=f"client {self.partition_id}: saved state")

    def on_download(self) -> None:
        """Hook called with the broadcast loaded and before the persistent part is restored."""

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The supervised term of the local objective (cross-entropy; JDFL replaces it by its joint-label
        loss, keeping every optimizer's other terms)."""
        return F.cross_entropy(logits, y)

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Local objective on one mini-batch (default: the task loss, cross-entropy, as FedAvg)."""
        return self.task_loss(self.model(x), y)

    def train(self, generator: torch.Generator) -> float:
        """Local training for ``local_epochs`` epochs of SGD on :meth:`batch_loss`; returns the mean loss."""
        train = self.data.train
        return self.sgd_epochs(train.x, train.y, self.batch_loss, generator)

    def sgd_epochs(self, x: torch.Tensor, targets: torch.Tensor, batch_loss, generator: torch.Generator) -> float:
        """``local_epochs`` epochs of SGD (the run's lr, momentum, weight decay, batch size, last-batch rule)
        of the whole model on ``batch_loss(x[batch], targets[batch])``; returns the mean loss."""
        opt = sgd(self.model.parameters(), self.cfg.lr, self.cfg.momentum, self.cfg.weight_decay)
        return train_epochs(self.model, x, targets, epochs=self.cfg.local_epochs, batch_size=self.cfg.batch_size,
                            optimizer=opt, batch_loss=batch_loss, generator=generator,
                            drop_last=self.cfg.drop_last_batch)

    def upload_arrays(self) -> list[np.ndarray]:
        """The upload's model section (default: ``upload_part`` of the model)."""
        return get_arrays(self.model, self.upload_part)

    def upload_content(self) -> dict[str, list[np.ndarray]]:
        """What :meth:`fit` sends back, by section (default: the model section; SCAFFOLD, FedDC, FedProc
        and FedFed add sections of their own)."""
        return {MODEL_SECTION: self.upload_arrays()}

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """(accuracy, loss, extra ``acc_*`` metrics) of the personalized model on the client's test split."""
        acc, loss = evaluate(self.model, self.data.test.x, self.data.test.y)
        return acc, loss, {}

    # --- Flower NumPyClient interface ---------------------------------------------------------
    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        """The upload part of the current model."""
        return get_arrays(self.model, self.upload_part)

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """One round of local training; returns only ``upload_part``, keeps ``persistent_part``."""
        server_round = server_round_of(config)
        self.begin_message(server_round, training=True)
        generator = seed_everything(self.cfg.seed, server_round, self.partition_id, seeds.CLIENT_FIT)
        self.receive(parameters, config)
        loss = self.train(generator)
        metrics: dict[str, Any] = {"train_loss": float(loss), "partition_id": self.partition_id,
                                   "node": node_identity()}
        if self.persistent_part:
            personal = get_arrays(self.model, self.persistent_part)
            self.save_state("personal", personal)
            metrics["state_digest"] = arrays_digest(personal)
        upload, counts = join_sections(self.upload_content(), self.upload_sections)
        metrics.update(counts)
        if self.partition_id in self._faulty:
            upload = corrupt_update(upload, self.cfg.fault, np.random.default_rng([self.cfg.seed, server_round]))
        return upload, len(self.data.train), metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Accuracy of this client's personalized model on its own test split."""
        server_round = server_round_of(config)
        self.begin_message(server_round, training=False)
        generator = seed_everything(self.cfg.seed, server_round, self.partition_id, seeds.CLIENT_EVALUATE)
        self.receive(parameters, config)
        metrics: dict[str, Any] = {"partition_id": self.partition_id}
        if self.persistent_part and self.load_state("personal") is not None:
            # digest of the persistent part as restored into the model that is evaluated
            metrics["state_digest"] = arrays_digest(get_arrays(self.model, self.persistent_part))
        acc, loss, extra = self.evaluate_personalized(generator)
        metrics.update(acc=float(acc), **extra)
        if self.data.val is not None:
            metrics.update(self.validation_metrics(server_round))
        if self.evaluated_digest is not None:
            metrics["state_digest"] = self.evaluated_digest
        return float(loss), len(self.data.test), metrics

    def validation_metrics(self, server_round: int) -> dict[str, float]:
        """The method's own evaluation (:meth:`evaluate_personalized`) once more, on the validation split in
        place of the test split, as ``val_acc``, ``val_loss`` and ``val_acc_<name>``. The evaluation stream is
        seeded anew so that any evaluation-time adaptation (pFedKDH-EA's head steps, FedBABU's fine-tuning)
        is the very one whose test accuracy is reported: val and test accuracies are of one model."""
        generator = seed_everything(self.cfg.seed, server_round, self.partition_id, seeds.CLIENT_EVALUATE)
        on_test = self.data
        self.data = dataclasses.replace(on_test, test=on_test.val)
        try:
            acc, loss, extra = self.evaluate_personalized(generator)
        finally:
            self.data = on_test
        return {VALIDATION_PREFIX + "acc": float(acc), VALIDATION_PREFIX + "loss": float(loss),
                **{VALIDATION_PREFIX + k: float(v) for k, v in extra.items()}}


class _MessageClient(NumPyClient):
    """The NumPyClient of one Flower message: the method's client, and for a fit message that carries the
    previous round's evaluation (``fedpers.core.wire.EVALUATE_ROUND``) that evaluation first.

    The carried evaluation and the training each get a client instance of their own, built the same way,
    sharing only ``context.state``: exactly what an evaluate message followed by a fit message does, so
    the numbers are those of the two messages (tests/test_carried_evaluation.py)."""

    def __init__(self, build: Callable[[], FedPersClient], partition_id: Callable[[], int]):
        self.build = build
        self.partition_id = partition_id

    @functools.cached_property
    def client(self) -> FedPersClient:
        """The method's client, built on first use: a properties query needs no model and no data."""
        return self.build()

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        """This node's partition id, without building the method's client: the server asks every node once,
        which at 10,000 clients is 10,000 messages."""
        return {"partition_id": self.partition_id()}

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        """The method client's upload part."""
        return self.client.get_parameters(config)

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """The method client's personalized evaluation."""
        return self.client.evaluate(parameters, config)

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """The carried evaluation (on the broadcast, with the evaluate message's config), then local training;
        the reply's metrics hold both."""
        evaluate_round = evaluate_round_of(config)
        if evaluate_round is None:
            return self.client.fit(parameters, config)
        evaluate_config = round_config(evaluate_round, **section_counts_of(config))  # the evaluate message's
        loss, examples, evaluated = self.client.evaluate(parameters, evaluate_config)
        arrays, num_examples, metrics = self.build().fit(parameters, config)
        return arrays, num_examples, {**metrics, **carried_metrics(loss, examples, evaluated)}


def message_client(client_class: type[FedPersClient], cfg: Config, context: Context) -> Client:
    """The Flower ``Client`` that handles one message for ``client_class`` (the ClientApp's and the
    in-process engine's one way to build a client)."""
    return _MessageClient(lambda: client_class(cfg, context),
                          lambda: partition_id_of(context, cfg.num_clients)).to_client()
