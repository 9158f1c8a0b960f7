"""Which bridge takes a request: a pure function over a registry snapshot (engine_bridge.registry).

Policy, in order (why: a bridge that holds the conversation's or the prompt's prefix in a slot
skips that prefill; everything else should spread):
1. only the bridges serving the requested model; among them those whose engine is up (none up:
   any of them, so that bridge answers ENGINE_UNAVAILABLE with its status, as one bridge did),
   and those whose queue has room (all full: any, which answers QUEUE_FULL);
2. the bridge that holds the conversation (a slot owned by `conversation_key`; several: the one
   with the longest prefix of the prompt);
3. else the longest exact shared prefix (registry prefix chains), at least MIN_PREFIX_BLOCKS;
4. else the less loaded of two picked at random (power of two choices: near-best balance without
   every router piling onto the one bridge its last snapshot called idlest).
Loads are the snapshot's corrected by `unseen`, what the caller knows that the bridge's last
registration cannot show yet: + the requests it routed there that are not answered yet (a burst
of new conversations reads one snapshot, and two choices over equal loads split 8 of them 5/3 or
6/2 as often as 4/4, and the over-packed bridge evicts a conversation's slot before it returns),
− those that ended since that bridge's beat (an agent's next turn, sent the moment the last one
ended, saw its bridge still busy with it and the imbalance guard sent it elsewhere).
The imbalance guard: affinity (2, 3) only counts among the bridges whose load is within
IMBALANCE_MARGIN (requests per slot) of the least loaded candidate's, so no conversation mix piles
everything on one host while another idles.

The queue bound stays global in this sense: each bridge keeps its own BRIDGE_QUEUE_LIMIT, and a
request is sent to a full bridge only when every bridge of its model is full, so QUEUE_FULL means
the model's whole pool is. A separate global counter would need cross-host accounting on every
submit and end for no stronger promise.
"""
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine_bridge.registry import BridgeInfo, shared_blocks

MIN_PREFIX_BLOCKS = 2     # 512 characters (~128 tokens): less is not worth a host's imbalance
IMBALANCE_MARGIN = 0.5    # requests per slot affinity may add over the least loaded candidate


@dataclass(frozen=True)
class Route:
    bridge: BridgeInfo
    reason: str            # "conversation" | "prefix" | "load" | "only"
    shared_blocks: int = 0  # prompt blocks the chosen bridge holds (prefix chains)


def candidates(bridges: list[BridgeInfo], model: str) -> list[BridgeInfo]:
    """The bridges that may take a request for `model` (policy item 1), sorted by id."""
    serving = [b for b in bridges if b.model == model]
    up = [b for b in serving if b.status == "up"] or serving
    return sorted([b for b in up if not b.full] or up, key=lambda b: b.id)


def _best_prefix(bridge: BridgeInfo, chain: str, conversation: str | None = None) -> int:
    """The longest prefix of the prompt a slot of `bridge` holds (only the conversation's slots
    when `conversation` is given)."""
    return max((shared_blocks(h.chain, chain) for h in bridge.held
                if conversation is None or h.conversation == conversation), default=0)


def _affine(pool: list[BridgeInfo], conversation_key: str | None, chain: str, load: Callable[[BridgeInfo], float]
            ) -> Route | None:
    """The bridge holding the conversation, else the longest prefix over the threshold, or None."""
    if conversation_key is not None:
        holders = [b for b in pool if any(h.conversation == conversation_key for h in b.held)]
        if holders:
            best = max(holders, key=lambda b: (_best_prefix(b, chain, conversation_key), -load(b)))
            return Route(best, "conversation", _best_prefix(best, chain, conversation_key))
    if chain:
        scored = [(_best_prefix(b, chain), b) for b in pool]
        blocks, best = max(scored, key=lambda sb: (sb[0], -load(sb[1])))
        if blocks >= MIN_PREFIX_BLOCKS:
            return Route(best, "prefix", blocks)
    return None


def route(bridges: list[BridgeInfo], model: str, *, conversation_key: str | None = None,
          prompt_chain: str = "", rng: random.Random | None = None,
          unseen: Mapping[str, int] | None = None) -> Route | None:
    """The bridge for a request (module docstring), or None when no live bridge serves `model`.
    `prompt_chain`: registry.prefix_chain(prompt) ("" skips prefix matching); `rng`: the
    randomness of the two choices (tests pass a seeded one); `unseen`: bridge id -> requests to
    add to (or, negative, take off) its registered running + queued."""
    pool = candidates(bridges, model)
    if len(pool) <= 1:
        return Route(pool[0], "only") if pool else None
    known = unseen or {}

    def load(b: BridgeInfo) -> float:
        return max(b.busy + b.queued + known.get(b.id, 0), 0) / max(b.slots, 1)

    least = min(load(b) for b in pool)
    affine = _affine([b for b in pool if load(b) <= least + IMBALANCE_MARGIN], conversation_key, prompt_chain, load)
    if affine is not None:
        return affine
    first, second = (rng or random).sample(pool, 2)
    return Route(second if load(second) < load(first) else first, "load")
