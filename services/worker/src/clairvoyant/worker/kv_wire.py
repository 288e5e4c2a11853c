"""A ``KvPrefix`` on the wire: the ``KVChunk`` stream of ExportKV / ImportKV, one chunk per layer.

    chunk 0:  layer 0, token_ids, model, tenant, workflow_id, num_layers | dtype, shape, data
    chunk l:  layer l                                                    | dtype, shape, data

``shape`` is ``[2, tokens, kv_heads, head_dim]`` (K then V) and ``data`` the layer's elements in
that order, in ``dtype``; empty from a runner without tensors.  A layer of Llama-3-8B in bf16 is
4 KiB per token, so one chunk stays under the 64 MiB message limit (``core.grpcutil``) up to 16k
tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.worker.core.kv_transfer import KvPrefix


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InvalidRequest(f"unknown dtype {name!r}", param="dtype")
    return dtype


class KvLayout:
    """What a worker's KV looks like: the chunks it sends and the only ones it accepts."""

    def __init__(
        self, model: str, num_layers: int, num_kv_heads: int, head_dim: int, dtype: str, tensors: bool
    ):
        self.model = model
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.tensors = tensors  # False: the runner holds none, chunks carry no data

    def shape(self, num_tokens: int) -> list[int]:
        return [2, num_tokens, self.num_kv_heads, self.head_dim]

    def chunks(self, prefix: KvPrefix, request_id: str) -> Iterator[worker_pb2.KVChunk]:
        """``prefix`` as the ExportKV stream."""
        shape = self.shape(prefix.num_tokens)
        for layer in range(self.num_layers):
            chunk = worker_pb2.KVChunk(request_id=request_id, layer=layer, dtype=self.dtype, shape=shape)
            if prefix.kv is not None:
                chunk.data = tensor_bytes(prefix.kv[layer])
            if layer == 0:
                chunk.token_ids.extend(prefix.token_ids)
                chunk.model = self.model
                chunk.tenant = prefix.namespace or ""
                chunk.workflow_id = prefix.workflow_id or ""
                chunk.num_layers = self.num_layers
            yield chunk


class PrefixAssembler:
    """Collects an ImportKV stream into a ``KvPrefix``.

    ``add`` raises ``InvalidRequest`` at the first chunk that does not fit ``layout`` (another
    model or layer count, a layer out of order, a wrong dtype, shape or data size); ``finish``
    raises it when the stream ended before its last layer.  Nothing is imported until ``finish``.
    """

    def __init__(self, layout: KvLayout) -> None:
        self.layout = layout
        self._layers: list[torch.Tensor] = []
        self._received = 0
        self._first: worker_pb2.KVChunk | None = None

    def add(self, chunk: worker_pb2.KVChunk) -> None:
        layout = self.layout
        if self._first is None:
            if chunk.model != layout.model:
                raise InvalidRequest(
                    f"KV of model {chunk.model!r}; this worker serves {layout.model!r}", param="model"
                )
            if chunk.num_layers != layout.num_layers:
                raise InvalidRequest(
                    f"KV of {chunk.num_layers} layers; this worker's model has {layout.num_layers}",
                    param="num_layers",
                )
            if not chunk.token_ids:
                raise InvalidRequest("the first chunk names no tokens", param="token_ids")
            self._first = chunk
        if chunk.layer != self._received:
            raise InvalidRequest(
                f"layer {chunk.layer} arrived where layer {self._received} was due", param="layer"
            )
        if self._received == layout.num_layers:
            raise InvalidRequest(f"more than {layout.num_layers} layers", param="layer")
        if chunk.dtype != layout.dtype:
            raise InvalidRequest(f"KV in {chunk.dtype!r}; this worker holds {layout.dtype!r}", param="dtype")
        expected = layout.shape(len(self._first.token_ids))
        if list(chunk.shape) != expected:
            raise InvalidRequest(
                f"a layer of shape {list(chunk.shape)}; this worker needs {expected}", param="shape"
            )
        if layout.tensors:
            dtype = torch_dtype(layout.dtype)
            size = math.prod(expected) * torch.empty((), dtype=dtype).element_size()
            if len(chunk.data) != size:
                raise InvalidRequest(
                    f"layer {chunk.layer} has {len(chunk.data)} bytes, not {size}", param="data"
                )
            raw = torch.frombuffer(bytearray(chunk.data), dtype=torch.uint8)
            self._layers.append(raw.view(dtype).reshape(expected))
        elif chunk.data:
            raise InvalidRequest("the chunks carry K/V data; this worker holds no tensors", param="data")
        self._received += 1

    def finish(self) -> KvPrefix:
        first = self._first
        if first is None:
            raise InvalidRequest("the KV stream was empty", param="chunks")
        if self._received < self.layout.num_layers:
            raise InvalidRequest(
                f"the KV stream ended after {self._received} of {self.layout.num_layers} layers",
                param="chunks",
            )
        return KvPrefix(
            namespace=first.tenant or "default",
            token_ids=tuple(first.token_ids),
            kv=torch.stack(self._layers) if self.layout.tensors else None,
            workflow_id=first.workflow_id or None,
        )
