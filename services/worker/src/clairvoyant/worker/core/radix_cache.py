"""Radix prefix cache over full KV blocks.

Each node holds one full block (``block_size`` tokens); its key is that block's token content and its
place in the tree is the content of every block before it, so a node's K/V is valid for any sequence
that starts with the tokens on the path from the root::

    namespace "acme"            namespace None (requests without lineage)
      [sys prompt 0:16]            [hello ...]
        [sys prompt 16:32]
          [user A 32:48] -> [reply A 48:64]
          [user B 32:48]

Namespaces are tenants: a lookup only walks its own tenant's tree, so no K/V (and no timing signal)
crosses tenants.  Every node is tagged with the lineage of the request that first computed it and
whether its tokens came from a prompt or a response, so cache policies can target e.g. "blocks of
agent X in workflow W".

The cache holds one reference on each node's block; the block manager owns the reference counts.
``evict`` reads them (a block whose count is 1 is held by the cache alone), and ``release`` drops a
finishing sequence's references in the same pass that touches its path.  Only leaves are evicted
(LRU on a logical clock), which keeps every cached path reachable from the root; ``evict`` returns
the blocks a full LRU scan would, without scanning (how: docs/architecture.md, "The worker engine").
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from clairvoyant.core.blockhash import next_hash
from clairvoyant.worker.core.types import KvEvent, Lineage, Tier

BlockSource = Literal["prompt", "response"]
_ID_BITS = 32  # block ids are below 2**32
_ID_MASK = (1 << _ID_BITS) - 1
Namespace = str | None


@dataclass(frozen=True)
class BlockTag:
    """Provenance of a cached block."""

    lineage: Lineage | None
    source: BlockSource


# One block for ``RadixCache.insert_held``: (namespace, parent block or None for the namespace
# root, the block's tokens, block id, tag).  A plain tuple: a decode run builds one per block.
HeldInsert = tuple[Namespace, int | None, tuple[int, ...], int, BlockTag]


class _Unknown:
    """The namespace argument left out (None is a namespace: requests without a tenant)."""


_UNKNOWN = _Unknown()


class RadixNode:
    __slots__ = ("block_hash", "block_id", "children", "key", "last_access", "parent", "tag")

    def __init__(self, key: tuple[int, ...], block_id: int, parent: RadixNode | None, tag: BlockTag | None):
        self.key = key
        self.block_id = block_id  # -1 for a namespace root
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.tag = tag
        self.last_access = 0
        self.block_hash = 0  # the chained hash of the path (``hashing`` caches only; 0 at a root)

    def path(self) -> list[RadixNode]:
        """The nodes from the namespace root's first child down to this one."""
        nodes: list[RadixNode] = []
        node: RadixNode | None = self
        while node is not None and node.block_id >= 0:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def namespace_root(self) -> RadixNode:
        node = self
        while node.parent is not None:
            node = node.parent
        return node


class RadixCache:
    """A block-granular radix tree per namespace.  Pure bookkeeping: never touches reference counts.

    With ``hashing``, every node also carries the chained hash of its path
    (``clairvoyant.core.blockhash``: the same chain completion records and L3 keys use), nodes can
    be found by it, and with ``events`` each insertion and removal is appended there as a
    ``KvEvent`` of ``tier`` (the worker publishes them; the simulator turns both off).
    """

    def __init__(
        self, block_size: int, *, hashing: bool = False, events: list[KvEvent] | None = None, tier: Tier = 1
    ) -> None:
        self.block_size = block_size
        self._roots: dict[Namespace, RadixNode] = {}
        self._node_of_block: dict[int, RadixNode] = {}
        self._clock = 0  # logical LRU clock: deterministic, independent of wall time
        self._lru: list[int] = []  # lazy heap of last_access << 32 | block_id: eviction candidates
        self.hashing = hashing or events is not None
        self.events = events
        self.tier: Tier = tier
        self._node_of_hash: dict[tuple[Namespace, int], RadixNode] = {}
        self._roots_ns: dict[int, Namespace] = {}  # id(root) -> its namespace (events name it)

    def _root(self, namespace: Namespace) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode((), -1, None, None)
            self._roots_ns[id(root)] = namespace
        return root

    def namespace_of(self, node: RadixNode) -> Namespace:
        return self._roots_ns[id(node.namespace_root())]

    def _added(self, namespace: Namespace, nodes: Sequence[RadixNode]) -> None:
        """Hash freshly linked ``nodes`` (consecutive, each the parent of the next) and report them."""
        if not self.hashing or not nodes:
            return
        parent = nodes[0].parent
        assert parent is not None
        previous = parent.block_hash
        index = self._node_of_hash
        for node in nodes:
            previous = node.block_hash = next_hash(previous, node.key)
            index[(namespace, previous)] = node
        if self.events is not None:
            self.events.append(KvEvent(
                "stored", self.tier, namespace, tuple(n.block_hash for n in nodes),
                parent.block_hash if parent.block_id >= 0 else None, nodes[0].tag,
            ))  # fmt: skip

    def _removed(self, nodes: Sequence[RadixNode], namespace: Namespace | _Unknown = _UNKNOWN) -> None:
        """Report unlinked ``nodes`` (``namespace_of`` must still resolve: call before unlinking
        the last of a namespace, or pass nodes whose parent chain is intact; or name their
        ``namespace``, which spares the walk up to the root)."""
        if not self.hashing or not nodes:
            return
        by_namespace: dict[Namespace, list[int]] = {}
        known = namespace
        for node in nodes:
            namespace = self.namespace_of(node) if isinstance(known, _Unknown) else known
            self._node_of_hash.pop((namespace, node.block_hash), None)
            by_namespace.setdefault(namespace, []).append(node.block_hash)
        if self.events is not None:
            for namespace, hashes in by_namespace.items():
                self.events.append(KvEvent("removed", self.tier, namespace, tuple(hashes), None, None))

    def node_of_hash(self, namespace: Namespace, block_hash: int) -> RadixNode | None:
        """The cached node whose path hashes to ``block_hash`` in ``namespace`` (``hashing`` only)."""
        return self._node_of_hash.get((namespace, block_hash))

    def node_of(self, block_id: int) -> RadixNode | None:
        return self._node_of_block.get(block_id)

    def nodes(self, namespace: Namespace) -> Iterator[RadixNode]:
        """Every cached node of ``namespace``, parents before their children."""
        root = self._roots.get(namespace)
        stack = list(root.children.values()) if root is not None else []
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def namespaces(self) -> list[Namespace]:
        return list(self._roots)

    def snapshot_events(self) -> list[KvEvent]:
        """What this tier holds, as the events a subscriber starting from nothing needs: a CLEARED,
        then one STORED per cached block, parents first (``hashing`` caches only)."""
        events = [KvEvent("cleared", self.tier, None, ())]
        for namespace in self.namespaces():
            for node in self.nodes(namespace):
                parent = node.parent
                parent_hash = parent.block_hash if parent is not None and parent.block_id >= 0 else None
                events.append(KvEvent("stored", self.tier, namespace, (node.block_hash,), parent_hash, node.tag))
        return events

    def drop(self, block_ids: Iterable[int], ref_counts: Sequence[int]) -> list[int]:
        """Remove the cached ``block_ids`` with everything cached below them, as far as only the
        cache holds those blocks (``ref_counts`` 1); a subtree with a held block keeps that block
        and its ancestors.  Returns the removed ids, children before parents."""
        nodes = self._node_of_block
        removed: list[int] = []

        def remove_below(top: RadixNode) -> None:
            # Post-order without recursion (a long chain is thousands of nodes deep): a node is
            # pushed again, marked, beneath its children, and judged once they are done.
            namespace = self.namespace_of(top) if self.hashing else None
            stack: list[tuple[RadixNode, bool]] = [(top, False)]
            while stack:
                node, children_done = stack.pop()
                if not children_done:
                    stack.append((node, True))
                    stack.extend((child, False) for child in reversed(list(node.children.values())))
                    continue
                if node.children or nodes.get(node.block_id) is not node or ref_counts[node.block_id] != 1:
                    continue
                self._removed((node,), namespace)
                parent = node.parent
                assert parent is not None
                del parent.children[node.key]
                del nodes[node.block_id]
                removed.append(node.block_id)
                if not parent.children and parent.block_id >= 0:
                    # A leaf now: give it an eviction entry (interior nodes have none; a stale
                    # one is skipped when popped), or a cached-only parent would never be evicted.
                    heapq.heappush(self._lru, parent.last_access << _ID_BITS | parent.block_id)

        for block_id in block_ids:
            node = nodes.get(block_id)
            if node is not None:
                remove_below(node)
        return removed

    def __len__(self) -> int:
        return len(self._node_of_block)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._node_of_block

    def match(self, namespace: Namespace, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids``, at most ``max_blocks`` blocks."""
        node = self._roots.get(namespace)
        blocks: list[int] = []
        self._clock += 1
        clock, bs = self._clock, self.block_size
        while node is not None and len(blocks) < max_blocks:
            start = len(blocks) * bs
            child = node.children.get(tuple(token_ids[start : start + bs]))
            if child is None:
                break
            child.last_access = clock  # ``_access``; only the last node may be a leaf
            blocks.append(child.block_id)
            node = child
        if blocks:
            self._access(node)  # type: ignore[arg-type]
        return blocks

    def peek(self, namespace: Namespace, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """``match`` without marking the blocks used: for reads on behalf of another worker (a KV
        export) or a plan, which must not change the eviction order."""
        node = self._roots.get(namespace)
        blocks: list[int] = []
        while node is not None and len(blocks) < max_blocks:
            start = len(blocks) * self.block_size
            node = node.children.get(tuple(token_ids[start : start + self.block_size]))
            if node is not None:
                blocks.append(node.block_id)
        return blocks

    def insert(
        self,
        namespace: Namespace,
        parent_block: int | None,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        tags: Sequence[BlockTag],
    ) -> list[int]:
        """Insert consecutive full blocks below ``parent_block`` (None: the namespace root).

        ``token_ids`` holds exactly ``len(block_ids) * block_size`` tokens.  Returns, per block, the id
        now cached for that content: the given id when it was new, else the id of the node that was
        already there (the caller should switch to it and drop its duplicate).
        """
        assert len(token_ids) == len(block_ids) * self.block_size == len(tags) * self.block_size
        node = self._root(namespace) if parent_block is None else self._node_of_block[parent_block]
        self._clock += 1
        clock, bs, nodes = self._clock, self.block_size, self._node_of_block
        canonical: list[int] = []
        added: list[RadixNode] = []  # new nodes are consecutive: once one is new, all below it are
        for i, (block_id, tag) in enumerate(zip(block_ids, tags, strict=True)):
            key = tuple(token_ids[i * bs : (i + 1) * bs])
            children = node.children
            child = children.get(key) if children else None  # below a new node: skip hashing the key
            if child is None:
                assert block_id not in nodes, f"block {block_id} cached twice"
                child = children[key] = nodes[block_id] = RadixNode(key, block_id, node, tag)
                added.append(child)
            child.last_access = clock  # every node but the last gets a child: only it may be a leaf
            canonical.append(child.block_id)
            node = child
        if block_ids:
            self._access(node)
        self._added(namespace, added)
        return canonical

    def has_child(self, namespace: Namespace, parent_block: int | None, key: tuple[int, ...]) -> bool:
        """Whether a block with content ``key`` is cached right below ``parent_block`` (None: the root)."""
        node = self._roots.get(namespace) if parent_block is None else self._node_of_block.get(parent_block)
        return node is not None and key in node.children

    def is_leaf(self, block_id: int) -> bool:
        """Whether the cached ``block_id`` has no cached block below it."""
        return not self._node_of_block[block_id].children

    def insert_held(self, inserts: Sequence[HeldInsert]) -> None:
        """``insert`` of one new block per entry, in order, each with its own clock tick, for blocks
        a running sequence holds (a decode run's filled blocks, ``block_manager.cache_in_order``).

        Each block must be new content below its parent (``has_child`` is False, and no two entries
        share parent and key).  No heap entry is pushed: a held block is not evictable, and the
        sequence's ``release`` pushes one when it lets go.
        """
        nodes = self._node_of_block
        clock = self._clock
        hashing = self.hashing
        for namespace, parent_block, key, block_id, tag in inserts:
            parent = self._root(namespace) if parent_block is None else nodes[parent_block]
            assert not parent.children or key not in parent.children, "insert_held needs new content"
            child = RadixNode(key, block_id, parent, tag)
            clock += 1
            child.last_access = clock
            parent.children[key] = child
            nodes[block_id] = child
            if hashing:
                self._added(namespace, (child,))
        self._clock = clock

    def release(self, block_ids: Sequence[int], ref_counts: list[int]) -> int:
        """A sequence lets go of its cached path ``block_ids``: ``touch`` it (one clock tick), drop
        its reference on each block from the block manager's ``ref_counts`` and make each block
        left with only the cache's reference a candidate again (``note_unreferenced``), in one pass
        (a finished sequence releases hundreds of blocks).  Returns how many were left so."""
        self._clock += 1
        clock, nodes, heap = self._clock, self._node_of_block, self._lru
        released = 0
        for block_id in block_ids:
            node = nodes[block_id]
            node.last_access = clock
            count = ref_counts[block_id] = ref_counts[block_id] - 1
            if count == 1:
                released += 1
                if not node.children:  # an interior node gets its entry in ``evict``
                    heapq.heappush(heap, clock << _ID_BITS | block_id)
            assert count >= 1, f"cached block {block_id} released twice"
        self._drop_stale_entries()
        return released

    def touch(self, block_ids: Sequence[int]) -> None:
        """Mark cached blocks as just used (a sequence that finishes uses ``release`` instead)."""
        self._clock += 1
        for block_id in block_ids:
            node = self._node_of_block.get(block_id)
            if node is not None:
                self._access(node)

    def note_unreferenced(self, block_ids: Iterable[int]) -> int:
        """The block manager's word that only the cache may hold each of ``block_ids`` now: the
        cached ones are candidates again.  Returns how many of them are cached."""
        nodes, heap = self._node_of_block, self._lru
        cached = 0
        for block_id in block_ids:
            node = nodes.get(block_id)
            if node is not None:
                cached += 1
                if not node.children:  # an interior node gets its entry in ``evict``
                    heapq.heappush(heap, node.last_access << _ID_BITS | block_id)
        return cached

    def evict(
        self, num_blocks: int, ref_counts: Sequence[int], on_evict: Callable[[RadixNode], None] | None = None
    ) -> list[int]:
        """Remove up to ``num_blocks`` least recently used leaves no one else references (the block
        manager's ``ref_counts`` say 1: the cache's own reference); their ids.  ``on_evict`` sees
        each node just before it is unlinked (its path still intact: a demotion copies it)."""
        heap, nodes = self._lru, self._node_of_block
        evicted: list[int] = []
        needed = num_blocks
        while heap and needed:
            entry = heapq.heappop(heap)
            block_id = entry & _ID_MASK
            node = nodes.get(block_id)
            if node is None or node.last_access != entry >> _ID_BITS or node.children or ref_counts[block_id] != 1:
                continue  # stale: a newer entry exists, or one is pushed when it becomes evictable
            while True:  # evict ``node``, then its parent while that is the next leaf to go
                if on_evict is not None:
                    on_evict(node)
                if self.hashing:
                    self._removed((node,))
                del nodes[block_id]
                parent = node.parent
                assert parent is not None
                siblings = parent.children
                if len(siblings) == 1:
                    siblings.clear()  # no need to hash the key (16 tokens) to drop an only child
                else:
                    del siblings[node.key]
                evicted.append(block_id)
                needed -= 1
                block_id = parent.block_id
                if block_id < 0 or parent.children:
                    break
                # The parent is a leaf now.  Its entry would be pushed and, when it is below every
                # other entry, popped right back: skip the round trip.
                entry = parent.last_access << _ID_BITS | block_id
                if needed and (not heap or entry < heap[0]) and ref_counts[block_id] == 1:
                    node = parent
                    continue
                heapq.heappush(heap, entry)
                break
        return evicted

    def _access(self, node: RadixNode) -> None:
        node.last_access = self._clock
        if node.children:
            return  # not a leaf: it can only become one in ``evict``, which pushes it then
        heapq.heappush(self._lru, self._clock << _ID_BITS | node.block_id)
        self._drop_stale_entries()

    def _drop_stale_entries(self) -> None:
        """Rebuild the heap once stale entries dominate it (which entries are stale never changes
        what ``evict`` returns: it skips them)."""
        if len(self._lru) > 4 * len(self._node_of_block) + 1024:
            self._lru = [n.last_access << _ID_BITS | b for b, n in self._node_of_block.items()]
            heapq.heapify(self._lru)

    def session_path(self, namespace: Namespace, workflow_id: str) -> tuple[list[int], list[int]]:
        """The deepest cached path holding a block a call of ``workflow_id`` computed: its block ids
        and tokens from the root (ancestors included, whoever computed them); ([], []) when none.
        Ties go to the most recently used path.  Walks the namespace's whole tree; changes nothing."""
        root = self._roots.get(namespace)
        best: RadixNode | None = None
        best_rank = (0, -1)
        stack = [(child, 1) for child in root.children.values()] if root is not None else []
        while stack:
            node, depth = stack.pop()
            tag = node.tag
            if tag is not None and tag.lineage is not None and tag.lineage.workflow_id == workflow_id:
                rank = (depth, node.last_access)
                if rank > best_rank:
                    best, best_rank = node, rank
            stack.extend((child, depth + 1) for child in node.children.values())
        path: list[RadixNode] = []
        while best is not None and best.block_id >= 0:
            path.append(best)
            best = best.parent
        path.reverse()
        return [node.block_id for node in path], [token for node in path for token in node.key]

    def tag_of(self, block_id: int) -> BlockTag | None:
        node = self._node_of_block.get(block_id)
        return None if node is None else node.tag

    def cached_blocks(self) -> Iterator[int]:
        return iter(self._node_of_block)

    def check_integrity(self) -> None:
        """Every node is reachable from its root through its parent links, and indexed exactly once."""
        seen = 0
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                assert child.parent is node and child.key == key and len(key) == self.block_size
                assert self._node_of_block.get(child.block_id) is child
                seen += 1
                stack.append(child)
        assert seen == len(self._node_of_block), (seen, len(self._node_of_block))
        if self.hashing:
            assert len(self._node_of_hash) == seen, (len(self._node_of_hash), seen)
            for (namespace, block_hash), node in self._node_of_hash.items():
                assert node.block_hash == block_hash and self._node_of_block.get(node.block_id) is node
                parent = node.parent
                assert parent is not None and node.block_hash == next_hash(parent.block_hash, node.key)
                assert self.namespace_of(node) == namespace
