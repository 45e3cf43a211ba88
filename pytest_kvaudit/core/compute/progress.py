"""How far a computation is: cells done per precision, tokens, seconds. The store reports a :class:`Tally`
through a ``Progress`` callback; the pytest side prints it (:mod:`pytest_kvaudit.progress`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: the share of the work done before a time left is printed
EARLIEST = 0.05


@dataclass
class Tally:
    """How far one store (or all shards together) is: cells done per precision, of ``items`` each."""

    dtypes: list[str]
    items: int
    done: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    seconds: float = 0.0
    #: the store is done; under xdist a worker's part of a shared queue is not known before its end
    finished: bool = False

    @property
    def fraction(self) -> float:
        total = self.items * len(self.dtypes)
        return sum(self.done.values()) / total if total else 1.0

    def line(self) -> str:
        per = ", ".join(f"{d} {self.done.get(d, 0)}/{self.items}" for d in self.dtypes)
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        f = self.fraction
        # the first cells carry the model load and one-time kernel set-up: a time left drawn from them alone
        # reads ten times too long, so it waits for a few percent of the work
        left = (f"~{self.seconds * (1 - f) / f:.0f}s left" if f >= EARLIEST or f == 1
                else "time left after a few more items")
        return f"kvaudit: items done {per}; {rate:,.0f} tokens/s; {left}"

    @classmethod
    def total(cls, tallies: list[Tally]) -> Tally:
        t = cls(list(tallies[0].dtypes), sum(x.items for x in tallies))
        for x in tallies:
            for d, n in x.done.items():
                t.done[d] = t.done.get(d, 0) + n
            t.tokens += x.tokens
        t.seconds = max(x.seconds for x in tallies)
        t.finished = all(x.finished for x in tallies)
        return t


Progress = Callable[[Tally], None]
