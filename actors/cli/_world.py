"""The world of ``fractor demo``: research topics, fake web pages, and tools that take time.

Nothing here touches the network. ``search`` and ``fetch_page`` make up their
results from the query and URL (on ``example.org``, a reserved domain), always the
same for the same input; every tool waits a simulated latency drawn from a range
(the same on every run for the same input) and divided by the demo's speed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from .._tools._tool import Tool, tool

__all__ = ["TOPICS", "Clock", "Topic", "make_tools", "pick_topics", "url"]


@dataclass(frozen=True, slots=True)
class Topic:
    slug: str
    title: str
    findings: tuple[str, str]


def _topic(slug: str, title: str, first: str, second: str) -> Topic:
    return Topic(slug, title, (first, second))


TOPICS = (
    _topic(
        "solar",
        "rooftop solar",
        "Public roofs (schools, depots, pools) are the fastest start: one owner, long "
        "horizons and daytime demand.",
        "Payback depends mostly on local tariffs and on how much output is used on site.",
    ),
    _topic(
        "batteries",
        "grid batteries",
        "Batteries earn most when they move midday solar into the evening peak.",
        "Two-hour systems cover most daily peaks; longer storage rarely pays yet.",
    ),
    _topic(
        "heat-pumps",
        "heat pumps",
        "Heat pumps cut heating emissions most where the grid is already fairly clean.",
        "Insulating first lets smaller, cheaper units do the job.",
    ),
    _topic(
        "wind",
        "wind power contracts",
        "A long-term purchase agreement fixes the price of clean power for city buildings.",
        "Pooling demand with neighbouring towns reaches the sizes developers bid for.",
    ),
    _topic(
        "demand",
        "demand response",
        "Shifting pumping and charging loads out of the peak is the cheapest capacity.",
        "Smart tariffs work when the default is opt-out rather than opt-in.",
    ),
    _topic(
        "retrofits",
        "building retrofits",
        "Deep retrofits of the worst tenth of buildings save the most per euro.",
        "Bundling many similar buildings in one tender brings prices down.",
    ),
    _topic(
        "ev-charging",
        "EV charging",
        "Depot charging for buses and service fleets comes first: the routes are known.",
        "Managed charging avoids most grid upgrades a naive rollout would need.",
    ),
    _topic(
        "district-heat",
        "district heating",
        "Waste heat from industry and data centres can feed a low-temperature network.",
        "Dense districts with one large anchor customer are where networks pay first.",
    ),
)

_FILLER = (
    "Several municipal pilots report results that depend strongly on local conditions.",
    "Costs have fallen steadily, although grid connection queues remain a bottleneck.",
    "The evidence is strongest where cities measured consumption before and after.",
    "Financing through long-term public loans lowers the cost of capital considerably.",
    "Residents respond better to programmes that come with a single point of contact.",
    "Procurement rules often matter as much as technology in how fast projects start.",
    "Most studies note that maintenance budgets are underestimated in early plans.",
    "Utilities are more willing to cooperate when data sharing is agreed up front.",
)


def pick_topics(fanout: int) -> list[Topic]:
    """The first ``fanout`` topics; past the named ones, numbered topics."""
    extra = (
        Topic(f"topic-{n}", f"topic {n}", TOPICS[n % len(TOPICS)].findings)
        for n in range(len(TOPICS) + 1, fanout + 1)
    )
    return [*TOPICS[:fanout], *extra]


class Clock:
    """Simulated latencies: the same for the same key on every run, scaled by speed."""

    def __init__(self, speed: float) -> None:
        self.scale = 1.0 / speed

    async def wait(self, key: str, low: float, high: float) -> None:
        await anyio.sleep(random.Random(key).uniform(low, high) * self.scale)


def url(query: str, index: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", query.lower()).strip("-")[:40]
    return f"https://example.org/{slug}/{index}"


def make_tools(clock: Clock, topics: Sequence[Topic]) -> dict[str, Tool[..., Any]]:
    @tool
    async def plan_research(question: str) -> str:
        """Split a question into research topics."""
        await clock.wait(f"plan:{question}", 0.05, 0.1)
        return "Topics: " + "; ".join(topic.title for topic in topics)

    @tool
    async def search(query: str) -> str:
        """Search the web; returns titles and URLs."""
        await clock.wait(f"search:{query}", 0.15, 0.3)
        return "\n".join(
            f"{index}. {query.capitalize()}: {kind} ({url(query, index)})"
            for index, kind in enumerate(("field report", "cost review", "case study"), 1)
        )

    @tool
    async def fetch_page(url: str) -> str:
        """Fetch a web page and return its text."""
        await clock.wait(f"fetch:{url}", 0.2, 0.4)
        draw = random.Random(url)
        sentences = [draw.choice(_FILLER) for _ in range(24)]
        return f"{url}\n" + " ".join(sentences)

    @tool
    async def take_notes(topic: str, notes: str) -> str:
        """Save research notes on a topic."""
        await clock.wait(f"notes:{topic}", 0.05, 0.08)
        return f"saved {notes.count('.') or 1} note(s) on {topic}"

    @tool
    async def lookup_source(claim: str) -> str:
        """Find primary sources for a claim."""
        await clock.wait(f"lookup:{claim}", 0.1, 0.25)
        return f"2 primary sources support: {claim[:60]}... (https://example.net/sources)"

    found = (plan_research, search, fetch_page, take_notes, lookup_source)
    return {entry.name: entry for entry in found}
