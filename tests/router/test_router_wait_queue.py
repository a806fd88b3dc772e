import asyncio

import pytest
from kvfleet_router.wait_queue import QueueFull, WaitQueue


async def test_priority_order_and_bound():
    q = WaitQueue(max_size=3)
    low = q.enter(5)
    high = q.enter(-1)
    mid = q.enter(0)
    with pytest.raises(QueueFull):
        q.enter(0)
    assert q.is_head(high)
    q.wake()
    assert high.done() and not low.done()
    q.leave(high)  # leaving wakes the next head
    assert q.is_head(mid) and mid.done()
    mid2 = q.rearm(mid)
    assert q.is_head(mid2) and not mid2.done()
    q.leave(mid2)
    q.leave(low)
    assert len(q) == 0
    await asyncio.sleep(0)
