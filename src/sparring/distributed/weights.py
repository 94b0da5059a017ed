"""How new weights reach the rollout workers.

* `ObjectStoreSync` (CPU workers, and the fallback): the driver puts the state dict in the
  Ray object store once per version (``ray.put``); every worker's ``set_weights`` call
  fetches it (from shared memory on the driver's node, over the network elsewhere). The
  references of the versions still wanted are kept, so a replaced worker can be given the
  exact weights its share was planned with.
* `CollectiveSync` (GPU workers): the driver (rank 0) and the workers (ranks 1..N) form a
  process group of their own (NCCL when the tensors are on GPUs, gloo on CPUs; built on a
  ``TCPStore`` hosted by the driver, not ``torch.distributed``'s default group, so it
  neither needs nor disturbs one), and the driver broadcasts each tensor straight from its
  device; nothing goes through the object store. The driver's side runs in a background
  thread on a copy of the weights, so in async mode the learner goes on while workers
  finish their queued shares. A dead rank leaves the others waiting in the broadcast, so
  when a worker dies all of them are replaced (`RayRollouts`), get the weights through the
  object store, and a new group is formed at the next publish; the old one is dropped.

Which weights: the first push sends the whole state dict (the worker's initial weights are
its own random draw); later pushes send only the parameters that train (all of them in full
fine-tuning, the adapters with LoRA).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from sparring.policy.lora import frozen_adapters, is_adapter_weight


def distinct_models(model: nn.Module | Mapping[str, nn.Module]) -> dict[str, nn.Module]:
    """``{prefix: model}`` of what the workers mirror: ``{'': model}`` for one model; for
    several policies ``{'NAME/': model}`` per distinct model (with ``lora.shared_base``
    the one base under the first policy's name)."""
    if not isinstance(model, Mapping):
        return {"": model}
    out: dict[str, nn.Module] = {}
    for name, m in model.items():
        if all(m is not other for other in out.values()):
            out[f"{name}/"] = m
    return out


def weights_to_send(model: nn.Module | Mapping[str, nn.Module], first: bool
                    ) -> dict[str, Tensor]:
    """The whole state dict on the first push, else the parameters that train (detached):
    those with ``requires_grad``, and every LoRA weight (PEFT turns ``requires_grad`` off
    for the adapters of a shared base that are not active). Never the frozen adapters of
    pool snapshots: a worker loads its own. Several policies: each distinct model's, its
    keys prefixed (`distinct_models`)."""
    out: dict[str, Tensor] = {}
    for prefix, m in distinct_models(model).items():
        frozen = frozen_adapters(m)
        if first:
            items = m.state_dict().items()
        else:
            items = [(k, p) for k, p in m.named_parameters() if p.requires_grad or ".lora_" in k]
        out.update({prefix + k: v.detach() for k, v in items
                    if not any(is_adapter_weight(k, a) for a in frozen)})
    return out


def load_weights(model: nn.Module | Mapping[str, nn.Module], state: Mapping[str, Tensor]
                 ) -> list[str]:
    """`weights_to_send`'s ``state`` into ``model`` (the worker's mirror of the driver's);
    returns the keys no model has."""
    models = distinct_models(model)
    unexpected = [k for k in state if not k.startswith(tuple(models))]
    for prefix, m in models.items():
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        unexpected += [prefix + k for k in m.load_state_dict(own, strict=False).unexpected_keys]
    return unexpected


def model_device(model: nn.Module | Mapping[str, nn.Module]) -> torch.device:
    """Where the (first) model's weights are."""
    return next(next(iter(distinct_models(model).values())).parameters()).device


class ObjectStoreSync:
    """``publish(version, state)`` puts it in the object store; ``send(worker, version)``
    queues the worker's ``set_weights`` with it."""

    kind = "object_store"

    def __init__(self, ray: Any):
        self.ray = ray
        self.refs: dict[int, Any] = {}

    def publish(self, version: int, state: dict[str, Tensor]) -> None:
        cpu = {k: v.to("cpu", copy=True) for k, v in state.items()}
        self.refs[version] = self.ray.put(cpu)

    def has(self, version: int) -> bool:
        return version in self.refs

    def send(self, worker: Any, version: int) -> Any:
        return worker.set_weights.remote(version, self.refs[version])

    def keep_only(self, versions: set[int]) -> None:
        """Drop the references of versions no pending share needs (frees the store)."""
        for v in [v for v in self.refs if v not in versions]:
            del self.refs[v]

    def close(self) -> None:
        self.refs.clear()


def tcp_store(host: str, port: int, world: int, timeout_s: float) -> Any:
    """The group's rendezvous: ``port=0`` hosts it on a free port (rank 0, the driver; the
    port is ``store.port``), another port joins the one hosted there."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world, is_master=port == 0,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def make_group(backend: str, store: Any, world: int, rank: int, timeout_s: float) -> Any:
    """A process group of ``world`` ranks on ``store`` (keep the store alive with it)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    raise ValueError(f"weight group backend {backend!r}; allowed: gloo, nccl")


def broadcast(group: Any, tensor: Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 of ``group`` (in place on the other ranks)."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def receive_broadcast(group: Any, layout: Sequence[tuple[str, list[int], str]],
                      device: torch.device) -> dict[str, Tensor]:
    """The tensors of ``layout`` (name, shape, dtype) broadcast by rank 0, in order, received
    on ``device``."""
    out = {}
    for name, shape, dtype in layout:
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        broadcast(group, t)
        out[name] = t
    return out


class CollectiveSync:
    """The driver's side of a broadcast group with the workers (see the module docstring).
    ``backend``: 'nccl' (tensors on GPUs) or 'gloo' (on CPUs)."""

    kind = "collective"

    def __init__(self, ray: Any, backend: str, device: torch.device, timeout_s: float = 600.0):
        self.ray, self.backend, self.device = ray, backend, torch.device(device)
        self.timeout_s = timeout_s
        self.fallback = ObjectStoreSync(ray)  # for replaced workers
        self.workers: list[Any] = []
        self.group: Any = None
        self.store: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.state: dict[str, Tensor] = {}
        self.version = -1

    def form(self, workers: list[Any]) -> None:
        """A new group: the driver as rank 0, ``workers[i]`` as rank ``i + 1``. A previous
        group (and a broadcast stuck in it) is dropped, not waited for."""
        self._thread, self._error, self.group = None, None, None
        host = self.ray.util.get_node_ip_address()
        world = len(workers) + 1
        self.store = tcp_store(host, 0, world, self.timeout_s)
        joined = [w.join_group.remote(host, self.store.port, world, self.backend,
                                      self.timeout_s) for w in workers]
        self.group = make_group(self.backend, self.store, world, 0, self.timeout_s)
        self.ray.get(joined)
        self.workers = list(workers)

    def publish(self, version: int, state: dict[str, Tensor]) -> None:
        self.wait()
        self.state = {k: v.to(self.device, copy=True).contiguous() for k, v in state.items()}
        self.version = version

    def has(self, version: int) -> bool:
        return version == self.version

    def broadcast(self) -> list[Any]:
        """Queue every worker's receive and broadcast the published weights from a thread;
        returns the workers' futures."""
        layout = [(k, list(v.shape), str(v.dtype).removeprefix("torch."))
                  for k, v in self.state.items()]
        futures = [w.receive_weights.remote(self.version, layout) for w in self.workers]
        tensors, group = list(self.state.values()), self.group

        def run() -> None:
            try:
                for t in tensors:
                    broadcast(group, t)
            except BaseException as e:  # reported by the next wait()
                self._error = e

        self._thread = threading.Thread(target=run, name="sparring-weight-broadcast",
                                        daemon=True)
        self._thread.start()
        return futures

    def wait(self) -> None:
        """Wait for the broadcast in flight; raise what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def keep_only(self, versions: set[int]) -> None:
        self.fallback.keep_only(versions)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.group = self.store = None  # the rendezvous' server thread and port go too
            self.fallback.close()
