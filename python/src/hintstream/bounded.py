"""``Bounded``: an insertion-ordered dict that drops its oldest entries past
a bound, counting and logging what it drops. What the client buffers for a
trainer that has not asked yet (hints, steps, metrics, chunks) is kept in
these, so a long run's memory stays bounded."""

from __future__ import annotations

import collections
import logging
from typing import Optional

log = logging.getLogger("hintstream")


class Bounded(collections.OrderedDict):  # type: ignore[type-arg]
    """An insertion-ordered dict that drops its oldest entries past
    ``limit`` (none: unbounded) when :meth:`trim` is called; ``evicted``
    counts them, and the first and every thousandth drop is logged as a
    warning naming ``what`` was dropped."""

    def __init__(self, limit: Optional[int], what: str) -> None:
        super().__init__()
        self.limit = limit
        self.what = what
        self.evicted = 0

    def trim(self) -> None:
        while self.limit is not None and len(self) > self.limit:
            key, _ = self.popitem(last=False)
            self.evicted += 1
            if self.evicted == 1 or self.evicted % 1000 == 0:
                log.warning("hintstream: dropped %d unread %s (oldest first, bound %d); latest %r", self.evicted, self.what, self.limit, key)
