"""The `search` tool: BM25 retrieval (bm25s) over a JSONL corpus mounted from a volume."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tool_sandbox.config import ConfigError, ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult

# bm25s (and numpy with it) is imported by a search tool when it indexes, not with this module: every
# pool imports it, most serve no search tool (the server's import alone: 141 -> 54 MiB without it).
if TYPE_CHECKING:
    import bm25s

_TEXT_KEYS = ("contents", "text", "content", "body", "passage")
_MAX_QUERY_CHARS = 4096


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


def parse_corpus(lines: list[str], source: str) -> list[Document]:
    """One JSON object per line with a text field (contents/text/content/body/passage)."""
    documents = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{number}: not JSON ({exc.msg}); the corpus is JSONL") from exc
        text = next(
            (record[k] for k in _TEXT_KEYS if isinstance(record, dict) and isinstance(record.get(k), str)),
            None,
        )
        if text is None:
            raise ConfigError(f"{source}:{number}: no text field; give one of {', '.join(_TEXT_KEYS)}")
        doc_id = str(record.get("id", record.get("_id", number)))
        documents.append(Document(doc_id, str(record.get("title", "")), text))
    if not documents:
        raise ConfigError(f"{source}: the corpus has no documents")
    return documents


def parse_query(payload: Any, default_k: int) -> tuple[str, int]:
    """A search call's input: the query string, or {"query": ..., "topK"?: n}."""
    if isinstance(payload, str):
        query, k = payload, default_k
    elif isinstance(payload, dict) and isinstance(payload.get("query"), str):
        query, k = payload["query"], payload.get("topK", default_k)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 100:
            raise ToolInputError("input.topK must be a whole number from 1 to 100")
    else:
        raise ToolInputError('input of a search tool must be a query string or {"query": "...", "topK": n}')
    if not query.strip():
        raise ToolInputError("the search query is empty")
    return query[:_MAX_QUERY_CHARS], k


def render(hits: list[tuple[Document, float]]) -> str:
    """Hits as the model reads them: numbered, with title and text."""
    return "\n".join(f"Doc {i}(Title: {doc.title}) {doc.text}" for i, (doc, _) in enumerate(hits, 1))


class SearchTool(Tool):
    type = "search"
    description = "Search the corpus and return the best matching passages."
    input_schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": "What to search for"},
            "topK": {"type": "integer", "minimum": 1, "maximum": 100, "description": "How many passages"},
        },
        "required": ["query"],
    }

    def __init__(self, config: ToolConfig) -> None:
        super().__init__(config)
        self.documents: list[Document] = []
        self.index: bm25s.BM25 | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._build)

    def _build(self) -> None:
        try:
            with open(self.config.corpus, encoding="utf-8") as handle:
                self.documents = parse_corpus(handle.readlines(), self.config.corpus)
        except OSError as exc:
            raise ConfigError(
                f"search tool {self.name}: cannot read corpus {self.config.corpus}: "
                f"{exc.strerror}; mount the data volume or fix the path"
            ) from exc
        import bm25s

        corpus = [f"{doc.title} {doc.text}" for doc in self.documents]
        index = bm25s.BM25()
        index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        self.index = index

    def search(self, query: str, k: int) -> list[tuple[Document, float]]:
        import bm25s

        assert self.index is not None
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        k = min(k, len(self.documents))
        ids, scores = self.index.retrieve(tokens, k=k, show_progress=False)
        return [(self.documents[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        query, k = parse_query(payload, self.config.top_k)
        started = time.monotonic()
        hits = await asyncio.to_thread(self.search, query, k)
        text = render(hits) if hits else "No results."
        raw = text.encode()
        output, truncated = outcome.cap_output(
            raw[: self.config.max_output_bytes], len(raw), self.config.max_output_bytes
        )
        return ToolResult(
            status=outcome.OK,
            output=output,
            stdout=output,
            exitCode=0,
            truncated=truncated,
            durationSeconds=round(time.monotonic() - started, 6),
        )
