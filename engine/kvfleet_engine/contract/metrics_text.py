"""The one reader of Prometheus `/metrics` text from vLLM and kvfleet engines.

The router (`kvfleet_router.signals`) and the operator (`kvfleet_operator.decide.role_signals`) both
read scrapes through here and only map the result onto their own types. The rules:

1. **Lines.** Blank lines and `#` lines (HELP, TYPE, comments) are skipped. A sample is
   `name[{labels}] value [timestamp]`. A line that does not parse is skipped and counted
   (`num_bad_lines`, `first_bad_line`); one bad line never fails the whole scrape.
2. **Usable or unknown.** A scrape is usable only when at least one core gauge (requests
   running, requests waiting, KV-cache usage; current or legacy name) has a finite value.
   Otherwise (an HTML error page, an empty body, nothing but garbage or NaN) `is_usable`
   is False and readers report the replica as unknown or failed, never as idle.
3. **Names.** Legacy vLLM names (`LEGACY_NAMES`) are read as the current ones. When a
   family is exposed under both names the current name wins, whatever the order; the two
   are never mixed or summed.
4. **Labels** follow the text format: `name="value"` pairs separated by commas (a trailing
   comma and whitespace around tokens are allowed). Values are double-quoted with the
   escapes `\\\\`, `\\"` and `\\n`; commas, braces and `=` inside the quotes belong to the
   value. A malformed label set makes the line bad.
5. **Values** are floats, `NaN`, `+Inf`, `-Inf` included. Non-finite values are well formed
   but carry no figure: they are left out of sums, and a gauge with only non-finite samples
   is absent. (`le="+Inf"` is a label, the histogram's last bucket, and is read as inf.)
6. **Label sets** (several models or engine cores in one process) are combined: counts
   (running, waiting, waiting prompt tokens, counters, histogram buckets per `le`) are
   summed; the KV-usage fraction is their mean; draining is true when the sum is > 0.
   The role is the `role` label of a nonzero `kvfleet:role` sample; the block size and the
   KV capacity in blocks are the `block_size` and `num_gpu_blocks` labels of
   `vllm:cache_config_info`. A bucket whose `le` is not a number
   (or is NaN) is ignored.
7. **Kinds.** Counters are read from `<name>_total`, histograms from cumulative
   `<name>_bucket{le=...}` samples and their `<name>_sum` (summed over label sets, into
   `histogram_sums`); `_created` and `_count` samples are not read.
8. **Peer prefix sharing** (kvfleet engines only, `contract.peer_prefix`): the counters
   `kvfleet:peer_fetch_{bytes,blocks,tokens}_total` and
   `kvfleet:peer_export_{bytes,blocks}_total`, and the histogram
   `kvfleet:peer_fetch_seconds`, whose sum over the bytes counter's delta is the
   bandwidth peers delivered; and for fetches that timed out, the counters
   `kvfleet:peer_fetch_timeout_bytes_asked_total` (blocks asked for x bytes per block)
   and `kvfleet:peer_fetch_timeout_seconds_total` (seconds waited), whose deltas' ratio
   is an upper bound on that bandwidth (`PEER_FAMILIES`).

`read_metrics(text)` reads every line. `read_gauges(text)` is the router's hot path: it
splits only lines named after a gauge or info metric (the rest are neither parsed nor
counted as bad) and fills gauges, role and block size only; `read_gauges(text,
also=PEER_FAMILIES)` also reads the lines of the counter and histogram families named.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field

from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.contract import wire as w

Buckets = tuple[tuple[float, float], ...]  # (upper bound `le`, cumulative count), by le

CORE_GAUGES = (w.NUM_REQUESTS_RUNNING, w.NUM_REQUESTS_WAITING, w.KV_CACHE_USAGE_PERC)
GAUGES = (*CORE_GAUGES, w.NUM_WAITING_PROMPT_TOKENS, w.DRAINING)
PEER_COUNTERS = (pp.PEER_FETCH_BYTES, pp.PEER_FETCH_BLOCKS, pp.PEER_FETCH_TOKENS,
                 pp.PEER_EXPORT_BYTES, pp.PEER_EXPORT_BLOCKS, pp.PEER_FETCH_TIMEOUT_BYTES,
                 pp.PEER_FETCH_TIMEOUT_SECONDS)
PEER_FAMILIES = (*PEER_COUNTERS, pp.PEER_FETCH_SECONDS)  # rule 8, for read_gauges(also=)
COUNTERS = (w.PREFIX_CACHE_QUERIES, w.PREFIX_CACHE_HITS, w.NUM_PREEMPTIONS, w.PROMPT_TOKENS,
            w.GENERATION_TOKENS, *PEER_COUNTERS)
HISTOGRAMS = (w.TIME_TO_FIRST_TOKEN, w.INTER_TOKEN_LATENCY, w.REQUEST_TIME_PER_OUTPUT_TOKEN,
              w.E2E_REQUEST_LATENCY,
              w.REQUEST_QUEUE_TIME, pp.PEER_FETCH_SECONDS)
INFOS = (w.ROLE_INFO, w.CACHE_CONFIG_INFO)
_MEAN_GAUGES = frozenset({w.KV_CACHE_USAGE_PERC})
_SUFFIX = {"gauge": "", "info": "", "counter": "_total", "histogram": "_bucket"}


def _lookup_table() -> dict[str, tuple[str, str, bool]]:
    """Exposed sample name -> (kind, current family name, is it a legacy name)."""
    kinds = {**dict.fromkeys(GAUGES, "gauge"), **dict.fromkeys(COUNTERS, "counter"),
             **dict.fromkeys(HISTOGRAMS, "histogram"), **dict.fromkeys(INFOS, "info")}
    table: dict[str, tuple[str, str, bool]] = {}
    for family, kind in kinds.items():
        table[family + _SUFFIX[kind]] = (kind, family, False)
    for legacy, family in w.LEGACY_NAMES.items():
        kind = kinds[family]
        table[legacy + _SUFFIX[kind]] = (kind, family, True)
    for name, (kind, family, is_legacy) in list(table.items()):
        if kind == "histogram":
            table[name.removesuffix("_bucket") + "_sum"] = ("sum", family, is_legacy)
    return table


_TABLE = _lookup_table()
_GAUGE_LINES = frozenset(n for n, (kind, _, _) in _TABLE.items() if kind in ("gauge", "info"))


def _lines_of(families: Collection[str]) -> frozenset[str]:
    """The exposed sample names of these families (any kind, legacy names included)."""
    wanted = frozenset(families)
    return frozenset(n for n, (_, family, _) in _TABLE.items() if family in wanted)

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(slots=True)
class MetricSample:
    name: str  # as exposed, suffix included (`vllm:prompt_tokens_total`)
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class ParsedText:
    samples: list[MetricSample] = field(default_factory=list)
    num_bad_lines: int = 0
    first_bad_line: str = ""


@dataclass(slots=True)
class EngineMetrics:
    """One scrape under current names; a family that was not exposed is absent."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # family name, no `_total`
    histograms: dict[str, Buckets] = field(default_factory=dict)
    histogram_sums: dict[str, float] = field(default_factory=dict)  # `<name>_sum`, by family
    role: str | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None  # KV capacity in blocks (cache_config_info's label)
    num_bad_lines: int = 0
    first_bad_line: str = ""

    @property
    def is_usable(self) -> bool:
        """Rule 2: False means unknown (a failed scrape), never idle."""
        return any(name in self.gauges for name in CORE_GAUGES)

    @property
    def is_draining(self) -> bool:
        return self.gauges.get(w.DRAINING, 0.0) > 0


def _parse_float(token: str) -> float | None:
    if "_" in token:  # Python's float() takes 1_000; the text format does not
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), value)


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int] | None:
    """Labels from just after `{`; (labels, position after `}`) or None if malformed."""
    labels: dict[str, str] = {}
    end = len(line)
    while True:
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos < end and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL.match(line, pos)
        if match is None or match.group(1) in labels:
            return None
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
        if pos < end and line[pos] == ",":
            pos += 1
        elif not (pos < end and line[pos] == "}"):
            return None


def _parse_sample(line: str, name: str, pos: int) -> MetricSample | None:
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        parsed = _parse_labels(line, pos + 1)
        if parsed is None:
            return None
        labels, pos = parsed
    if pos >= len(line) or line[pos] not in " \t":
        return None
    rest = line[pos:].split()
    if len(rest) not in (1, 2):
        return None
    value = _parse_float(rest[0])
    if value is None or (len(rest) == 2 and not rest[1].lstrip("-").isdigit()):
        return None
    return MetricSample(name, labels, value)


def parse_text(text: str, only: Collection[str] | None = None) -> ParsedText:
    """Every sample line of `text` (rule 1), or only those whose name is in `only`."""
    out = ParsedText()
    prefixes = tuple(only) if only is not None else None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#" or (prefixes is not None and not line.startswith(prefixes)):
            continue
        match = _NAME.match(line)
        if match is not None and only is not None and match.group() not in only:
            continue
        sample = _parse_sample(line, match.group(), match.end()) if match else None
        if sample is None:
            out.num_bad_lines += 1
            out.first_bad_line = out.first_bad_line or line
        else:
            out.samples.append(sample)
    return out


def _finite_sum(samples: list[MetricSample]) -> tuple[float, int]:
    values = [s.value for s in samples if math.isfinite(s.value)]
    return sum(values), len(values)


def _reduce(parsed: ParsedText) -> EngineMetrics:
    out = EngineMetrics(num_bad_lines=parsed.num_bad_lines, first_bad_line=parsed.first_bad_line)
    by_family: dict[str, dict[bool, list[MetricSample]]] = {}
    sums: dict[str, dict[bool, list[MetricSample]]] = {}
    for s in parsed.samples:
        entry = _TABLE.get(s.name)
        if entry is not None:
            group = sums if entry[0] == "sum" else by_family
            group.setdefault(entry[1], {}).setdefault(entry[2], []).append(s)
    for family, by_age in sums.items():
        total, count = _finite_sum(by_age.get(False) or by_age[True])  # rule 3
        if count:
            out.histogram_sums[family] = total
    for family, by_age in by_family.items():
        samples = by_age.get(False) or by_age[True]  # rule 3: the current name wins
        if family in GAUGES or family in COUNTERS:
            total, count = _finite_sum(samples)
            if count:
                target = out.counters if family in COUNTERS else out.gauges
                target[family] = total / count if family in _MEAN_GAUGES else total
        elif family in HISTOGRAMS:
            per_le: dict[float, float] = {}
            for s in samples:
                le = _parse_float(s.labels.get("le", ""))
                if le is not None and not math.isnan(le) and math.isfinite(s.value):
                    per_le[le] = per_le.get(le, 0.0) + s.value
            if per_le:
                out.histograms[family] = tuple(sorted(per_le.items()))
        elif family == w.ROLE_INFO:
            roles = [s.labels["role"] for s in samples
                     if "role" in s.labels and math.isfinite(s.value) and s.value != 0]
            out.role = roles[-1] if roles else None
        else:  # CACHE_CONFIG_INFO
            out.block_size = _positive_label(samples, "block_size")
            out.num_gpu_blocks = _positive_label(samples, "num_gpu_blocks")
    return out


def _positive_label(samples: list[MetricSample], label: str) -> int | None:
    """The last sample's `label` as a positive whole number, or None if none has one."""
    values = [_parse_float(s.labels.get(label, "")) for s in samples]
    finite = [int(x) for x in values if x is not None and math.isfinite(x) and x > 0]
    return finite[-1] if finite else None


def read_metrics(text: str) -> EngineMetrics:
    """Everything the contract names, from one `/metrics` body (module docstring rules)."""
    return _reduce(parse_text(text))


def read_gauges(text: str, also: Collection[str] = ()) -> EngineMetrics:
    """The hot path: gauges, role and block size, plus the counter and histogram families
    named in `also` (e.g. `PEER_FAMILIES`); other lines are not parsed."""
    only = _GAUGE_LINES | _lines_of(also) if also else _GAUGE_LINES
    return _reduce(parse_text(text, only=only))
