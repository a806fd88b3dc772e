"""What a routing decision looks at besides the endpoints: the request and its prefix view."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvfleet_router.request_info import RequestInfo


@dataclass(slots=True)
class RouteContext:
    request: RequestInfo = field(default_factory=RequestInfo)
    role: str = "unified"  # the role wanted for this leg
    num_prompt_tokens: int = 0  # estimated without a tokenizer when only text is known
    prefix_fraction: dict[str, float] = field(default_factory=dict)  # endpoint -> matched/total
    # endpoint -> extra fraction a peer fetch is worth (kv_sharing; peer_hint.fetch_credit)
    peer_credit: dict[str, float] = field(default_factory=dict)
    now: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def uncached_tokens(self, endpoint: str) -> float:
        return self.num_prompt_tokens * (1.0 - self.prefix_fraction.get(endpoint, 0.0))
