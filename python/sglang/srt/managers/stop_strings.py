"""Stop strings matched as text streams in: an Aho-Corasick automaton over one request's stop list,
shared by every request with the same list, and the incremental decoding that feeds it.

The scheduler (which finishes a request on a match) and the detokenizer (which holds back text
that may be the start of a stop string) each keep a `StopState` per request: one step costs what
its new characters cost, whatever the length of the list, instead of re-checking every stop
string against the tail of the output."""

from __future__ import annotations

import dataclasses
from array import array
from collections import OrderedDict, deque
from typing import Callable, Optional

# Tokens decoded again before the new ones, so that merges across the boundary come out right.
CONTEXT_TOKENS = 5
# Distinct stop lists whose automata are kept (n samples of one request share one).
AUTOMATON_CACHE_SIZE = 16


class StopAutomaton:
    """Trie of the stop strings with failure links. A state is a node: the longest end of the text
    fed so far that is the start of some stop string. Kept compact (one dict of edges keyed by
    node and character, arrays of ints), since live requests each hold theirs."""

    def __init__(self, stops: tuple[str, ...]):
        self.goto: dict[int, int] = {}  # (node << 21) | ord(char) -> child
        self.depth = array("l", [0])
        self.match: dict[int, str] = {}  # node -> a stop string ending there (itself or by its failure chain)
        children: list[list[tuple[str, int]]] = [[]]
        for stop in stops:
            self._add(stop, children)
        self.fail = array("l", [0]) * len(self.depth)
        self._link(children)

    def _add(self, stop: str, children: list) -> None:
        node = 0
        for char in stop:
            key = (node << 21) | ord(char)
            nxt = self.goto.get(key)
            if nxt is None:
                nxt = self.goto[key] = len(self.depth)
                self.depth.append(self.depth[node] + 1)
                children.append([])
                children[node].append((char, nxt))
            node = nxt
        self.match.setdefault(node, stop)

    def _link(self, children: list) -> None:
        queue = deque(child for _, child in children[0])
        while queue:
            node = queue.popleft()
            for char, child in children[node]:
                fallback = self.step(self.fail[node], char)
                self.fail[child] = fallback
                if child not in self.match and fallback in self.match:
                    self.match[child] = self.match[fallback]
                queue.append(child)

    def step(self, node: int, char: str) -> int:
        goto, fail, code = self.goto, self.fail, ord(char)
        while True:
            nxt = goto.get((node << 21) | code)
            if nxt is not None:
                return nxt
            if not node:
                return 0
            node = fail[node]


_AUTOMATA: OrderedDict[tuple[str, ...], StopAutomaton] = OrderedDict()


def stop_automaton(stops: list[str]) -> StopAutomaton:
    key = tuple(stops)
    automaton = _AUTOMATA.get(key)
    if automaton is None:
        automaton = _AUTOMATA[key] = StopAutomaton(key)
        if len(_AUTOMATA) > AUTOMATON_CACHE_SIZE:
            _AUTOMATA.popitem(last=False)
    else:
        _AUTOMATA.move_to_end(key)
    return automaton


class StopState:
    """One request's position in its stop automaton."""

    def __init__(self, stops: list[str]):
        self.automaton = stop_automaton(stops)
        self.node = 0

    def feed(self, text: str) -> Optional[str]:
        """Advances over `text`; returns the first stop string completed in it, if any."""
        automaton, node, first = self.automaton, self.node, None
        for char in text:
            node = automaton.step(node, char)
            if first is None:
                first = automaton.match.get(node)
        self.node = node
        return first

    @property
    def held_len(self) -> int:
        """Characters at the end of the text that may be the start of a stop string."""
        return self.automaton.depth[self.node]


@dataclasses.dataclass
class IncrementalText:
    """Token ids -> text, a few tokens at a time, never splitting a UTF-8 character."""

    ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""  # decoded so far (complete characters only)
    read_offset: int = 0  # tokens whose text is in `text`

    def extend(self, new_ids, decode: Callable[[list[int]], str]) -> str:
        """Appends `new_ids`; returns the text that became complete."""
        self.ids.extend(new_ids)
        context_start = max(0, self.read_offset - CONTEXT_TOKENS)
        before = decode(self.ids[context_start : self.read_offset])
        after = decode(self.ids[context_start:])
        # An incomplete character waits for the bytes that finish it.
        if after.endswith("\ufffd") or not after.startswith(before):
            return ""
        new_text = after[len(before) :]
        self.text += new_text
        self.read_offset = len(self.ids)
        return new_text
