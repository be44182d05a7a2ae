"""How large a Fleet API request body may be: the bound the proxy in front of the SuperLink puts on it, and
the largest bodies a run's clients send, measured on Flower's own objects.

The SuperLink reads a whole request body before it checks the node's signature, so the proxy
(``deploy/nginx/fleet-proxy.conf.template``) bounds what an unsigned request can make it hold. A run whose
clients would send more than that bound is refused before it starts: by ``fedpers deploy local`` before any
process starts, and by the ServerApp before round 1 against the bound its deployment gives it
(:data:`FLEET_BOUND_ENV`), rather than meeting nginx's 413 in the middle of a round.

Apart from ``fedpers.apps.deploy`` because the ServerApp uses it too, and ``deploy`` imports the ServerApp's
app directory (a cycle otherwise).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Sequence

from fedpers.core.errors import FedpersError

MIB = 2**20
# The SuperLink reads a whole request body before it checks the node's signature, so the proxy bounds what an
# unsigned request can make it hold. A client's reply reaches the SuperLink as one push-object request per
# object, and Flower cuts every array into chunks of at most 5 MiB (FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE): the
# largest body is one chunk and a few hundred bytes, whatever the model's size. The 1 MiB above the chunk
# covers the objects that are never chunked (the record listing a model's arrays, metrics).
DEFAULT_FLEET_MAX_OBJECT_BODY = "6m"
# Every other Fleet request carries metadata only (a message without its content, the tree of its object
# ids, heartbeats, keys): deploy/nginx/fleet-proxy.conf.template gives them this bound (nginx's own default).
FLEET_OTHER_BODY_BOUND = 1 * MIB
# The proxy's push-object bound as the ServerApp sees it (deploy local and compose set it for the ServerApp
# runner), so that a run whose clients would send larger bodies is refused before round 1, not by a 413.
FLEET_BOUND_ENV = "FEDPERS_FLEET_MAX_OBJECT_BODY"
FLEET_BOUND_KEYS = "`fedpers deploy local --fleet-max-object-body`, or FLEET_MAX_OBJECT_BODY for docker compose"
_NGINX_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def nginx_size(text: str, key: str) -> int:
    """Bytes of an nginx size (``6m``, ``512k``, ``1g``, ``1048576``); a FedpersError naming ``key`` when
    ``text`` is not one or is 0 (nginx reads 0 as "no bound", which is what this bound exists to prevent)."""
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", str(text))  # as nginx reads it: no spaces, no other unit
    if not match or int(match.group(1)) == 0:
        raise FedpersError(f"{key}: {text!r} is not an nginx size above 0 (e.g. 6m, 512k, 1g or a number of bytes)")
    return int(match.group(1)) * _NGINX_UNITS[match.group(2).lower()]


@dataclass(frozen=True)
class FleetBodies:
    """The largest Fleet request bodies a run's clients send (bytes), measured on Flower's own objects."""

    push_object: int  # the largest /v1/fleet/push-object body (one object of a fit reply)
    push_messages: int  # the /v1/fleet/push-messages body (the reply without its content, its object tree)
    upload: int  # the fit reply's array bytes (what the push-object requests carry together)

    def line(self, bound: int) -> str:
        """One line for the user: the sizes and the proxy's bound."""
        return (f"largest Fleet request of a client: push-object {self.push_object / MIB:.2f} MiB of a "
                f"{self.upload / MIB:.2f} MiB upload (proxy bound {bound / MIB:.2f} MiB), push-messages "
                f"{self.push_messages / 2**10:.1f} KiB (bound {FLEET_OTHER_BODY_BOUND / MIB:.0f} MiB)")


def fleet_bodies_of(arrays: Sequence, metrics: dict) -> FleetBodies:
    """The Fleet request bodies of a fit reply carrying ``arrays`` and ``metrics``: the reply built as
    Flower's legacy client path builds it (``fitres_to_recorddict``), every object of it deflated and put in
    the ``PushObjectRequest`` the SuperNode sends, and the ``PushMessagesRequest`` with its object tree."""
    from flwr.app import Message, Metadata
    from flwr.app.message.message import remove_content_from_message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.common.serde import message_to_proto
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.message_pb2 import ObjectTree, PushObjectRequest
    from flwr.proto.node_pb2 import Node

    widest = 2**63 - 1  # ids as wide as protobuf's varints get: no body is underestimated
    res = FitRes(Status(Code.OK, "Success"), ndarrays_to_parameters(list(arrays)), widest, dict(metrics))
    metadata = Metadata(run_id=widest, message_id="", src_node_id=widest, dst_node_id=widest,
                        reply_to_message_id="f" * 64, group_id=str(widest), created_at=time.time(), ttl=86400.0,
                        message_type="train")
    message = Message(content=fitres_to_recorddict(res, keep_input=False), metadata=metadata)
    objects, todo = {}, [message]
    while todo:  # the message and every object below it, once each (what the SuperNode pushes)
        obj = todo.pop()
        if obj.object_id not in objects:
            objects[obj.object_id] = obj
            todo.extend((obj.children or {}).values())
    node = Node(node_id=widest)
    push_object = max(PushObjectRequest(node=node, run_id=widest, object_id=object_id, object_content=obj.deflate(),
                                        session_id="f" * 64).ByteSize() for object_id, obj in objects.items())

    def tree(obj) -> ObjectTree:
        return ObjectTree(object_id=obj.object_id, children=[tree(child) for child in (obj.children or {}).values()])

    push_messages = PushMessagesRequest(node=node, messages_list=[message_to_proto(remove_content_from_message(message))],
                                        message_object_trees=[tree(message)], clientapp_runtime_list=[1e9]).ByteSize()
    return FleetBodies(push_object, push_messages, sum(int(getattr(a, "nbytes", 0)) for a in arrays))


def fleet_bodies(cfg) -> FleetBodies:
    """The Fleet request bodies of the largest fit reply of ``cfg``'s clients: the uploaded part of the
    run's model (the model kind and dataset of ``cfg``), once per section the method uploads (SCAFFOLD's
    control variates, FedFed's features, ... taken as large as the model part)."""
    from fedpers.core.models import build_model, get_arrays
    from fedpers.registry.methods import client_class_for, federation_for, model_kind_of

    fed = federation_for(cfg)
    client_cls = client_class_for(cfg)
    model = build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim, dropout=cfg.dropout,
                        seed=cfg.seed, kind=model_kind_of(cfg))
    part = get_arrays(model, client_cls.contract.upload_part)
    arrays = part * max(1, len(client_cls.contract.upload))
    metrics = {"train_loss": 0.0, "partition_id": fed.num_clients, "node": "f" * 64, "state_digest": "f" * 64}
    return fleet_bodies_of(arrays, metrics)


def check_fleet_bound(cfg, bound: int) -> FleetBodies:
    """``cfg``'s largest Fleet bodies (:func:`fleet_bodies`), or a FedpersError saying which bound to raise
    when the proxy would refuse one of them (nginx's 413, in the middle of the run)."""
    bodies = fleet_bodies(cfg)
    if bodies.push_object > bound:
        raise FedpersError(
            f"a client of this run sends push-object bodies of {bodies.push_object} bytes "
            f"({bodies.push_object / MIB:.2f} MiB), more than the Fleet proxy accepts ({bound} bytes): raise the "
            f"proxy's bound ({FLEET_BOUND_KEYS}) to at least {-(-bodies.push_object // MIB)}m")
    if bodies.push_messages > FLEET_OTHER_BODY_BOUND:
        raise FedpersError(
            f"a client of this run sends push-messages bodies of {bodies.push_messages} bytes, more than the Fleet "
            f"proxy's {FLEET_OTHER_BODY_BOUND} for requests other than push-object: raise client_max_body_size of "
            f"location /v1/fleet/ in deploy/nginx/fleet-proxy.conf.template and FLEET_OTHER_BODY_BOUND")
    return bodies
