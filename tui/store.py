"""Chat history: SQLite in the user data dir, WAL mode, every message with its stats.

Each write is one transaction, so a process killed mid-write leaves either the whole
message or none of it (SQLite's journal rolls a half-done write back on the next open).
Exports (Markdown, JSON) are written with paths.atomic_write: never half a file.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.core.errors import OndeviceError
from ondevice.core.fmt import stats_footer  # the export shows it under each answer
from ondevice.core.stored import StoredFileError, parse_json

__all__ = [
    "HistoryStore",
    "StoredMessage",
    "Conversation",
    "ConversationSummary",
    "HistoryError",
    "default_db_path",
    "to_markdown",
]

SCHEMA_VERSION = 1
_TITLE_CHARS = 60
_ROLES = ("system", "user", "assistant", "note")
LATEST_TIME_S = 253402300799  # 9999-12-31: a later time (or NaN) is damage, and would overflow time.localtime
MAX_JSON_CHARS = 1 << 20  # stats or settings of one row; what this program writes is a few hundred characters
_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    system TEXT,
    settings_json TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'note')),
    content TEXT NOT NULL,
    finish_reason TEXT,
    stats_json TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


class HistoryError(OndeviceError):
    """The history database cannot be opened or a conversation does not exist."""


@dataclass(frozen=True)
class StoredMessage:
    id: int  # row id, increasing in write order
    role: str  # "user", "assistant", or "note" (a line the app wrote, e.g. turns dropped)
    content: str  # message text (Markdown for the assistant)
    finish_reason: str | None  # assistant only: "stop", "length", "cancelled"
    stats: dict[str, Any] | None  # assistant only: Generation.to_dict() without text/token ids
    created_at: float  # seconds since the Unix epoch


@dataclass(frozen=True)
class ConversationSummary:
    id: int  # conversation row id
    title: str  # first user message, shortened
    model: str  # model name or path it was held with
    updated_at: float  # seconds since the Unix epoch, last message
    n_messages: int  # user + assistant messages
    notes: tuple[str, ...] = ()  # what was damaged in its row and replaced, one line each (empty: nothing)


@dataclass(frozen=True)
class Conversation:
    id: int  # conversation row id
    title: str  # first user message, shortened
    model: str  # model name or path
    system: str | None  # system prompt
    settings: dict[str, Any]  # sampling settings when it was started
    created_at: float  # seconds since the Unix epoch
    updated_at: float  # seconds since the Unix epoch
    messages: tuple[StoredMessage, ...] = field(default=())  # in order
    notes: tuple[str, ...] = ()  # damaged values replaced or rows left out while loading, one line each

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "model": self.model,
            "system": self.system,
            "settings": self.settings,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "messages": [
                {
                    "role": m.role,
                    "content": m.content,
                    "finish_reason": m.finish_reason,
                    "stats": m.stats,
                    "created_at": m.created_at,
                }
                for m in self.messages
            ],
        }


def default_db_path() -> Path:
    return paths.data_dir() / "history.sqlite3"


class HistoryStore:
    """A small thread-safe wrapper over one SQLite connection."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_db_path()
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._migrate()
        except (sqlite3.Error, OSError) as exc:
            raise HistoryError(f"history database {self.path}: {exc}") from exc

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(f"history database {self.path} is from a newer ondevice (schema {version})")
        if version == SCHEMA_VERSION:
            return
        with self._tx() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _tx(self):
        return _Transaction(self._db, self._lock, self.path)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes -------------------------------------------------------------------------

    def create_conversation(
        self, model: str, system: str | None = None, settings: Mapping[str, Any] | None = None
    ) -> int:
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations (model, system, settings_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (model, system, json.dumps(dict(settings or {})), now, now),
            )
            return int(cur.lastrowid)

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        finish_reason: str | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> int:
        """Append one message (one transaction: all of it or none of it)."""
        now = time.time()
        stats_json = json.dumps(dict(stats), allow_nan=False, default=_json_default) if stats is not None else None
        with self._tx() as db:
            self._require(db, conversation_id)
            cur = db.execute(
                "INSERT INTO messages (conversation_id, role, content, finish_reason, stats_json, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, finish_reason, stats_json, now),
            )
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            if role == "user":
                db.execute(
                    "UPDATE conversations SET title = ? WHERE id = ? AND title = ''",
                    (_title(content), conversation_id),
                )
            return int(cur.lastrowid)

    def set_system(self, conversation_id: int, system: str | None) -> None:
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute("UPDATE conversations SET system = ? WHERE id = ?", (system, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- reads --------------------------------------------------------------------------

    def list_conversations(self, limit: int = 100) -> list[ConversationSummary]:
        """Newest first; conversations with no message are left out."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT c.id, c.title, c.model, c.updated_at, COUNT(m.id) FROM conversations c "
                "JOIN messages m ON m.conversation_id = c.id AND m.role IN ('user', 'assistant') "
                "GROUP BY c.id ORDER BY c.updated_at DESC, c.id DESC LIMIT ?",
                (int(limit),),
            ).fetchall()
        return [_summary_from_row(r) for r in rows]

    def last_conversation_id(self) -> int | None:
        found = self.list_conversations(limit=1)
        return found[0].id if found else None

    def load(self, conversation_id: int) -> Conversation:
        with self._tx() as db:
            row = self._require(db, conversation_id)
            msgs = db.execute(
                "SELECT id, role, content, finish_reason, stats_json, created_at FROM messages "
                "WHERE conversation_id = ? ORDER BY id",
                (conversation_id,),
            ).fetchall()
        return _conversation_from_rows(row, msgs)

    def integrity_check(self) -> str:
        with self._tx() as db:
            return str(db.execute("PRAGMA integrity_check").fetchone()[0])

    @staticmethod
    def _require(db: sqlite3.Connection, conversation_id: int) -> tuple:
        row = db.execute(
            "SELECT id, title, model, system, settings_json, created_at, updated_at FROM conversations WHERE id = ?",
            (int(conversation_id),),
        ).fetchone()
        if row is None:
            raise HistoryError(f"no conversation with id {conversation_id}")
        return row

    # -- export -------------------------------------------------------------------------

    def export(self, conversation_id: int, path: Path | str) -> Path:
        """Write a conversation to `path`: JSON if it ends in .json, else Markdown. Atomic."""
        path = Path(path)
        conv = self.load(conversation_id)
        text = json.dumps(conv.to_dict(), indent=2) + "\n" if path.suffix.lower() == ".json" else to_markdown(conv)
        try:
            with paths.atomic_write(path, "w") as handle:
                handle.write(text)
        except OSError as exc:
            raise HistoryError(f"cannot write {path}: {exc}") from exc
        return path


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT under the store's lock; ROLLBACK on any exception."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, path: Path):
        self.db, self.lock, self.path = db, lock, path

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            self.lock.release()
            if isinstance(exc, sqlite3.Error):
                raise HistoryError(f"history database {self.path}: {exc}") from exc
            raise
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.lock.release()
        if isinstance(exc, sqlite3.Error):
            raise HistoryError(f"history database {self.path}: {exc}") from exc


# -- the validated row loader -------------------------------------------------------------------
# Every row read back goes through these: the database may have been written by another program
# or damaged (a blob in a text column, text in a number column, JSON that does not parse). A
# damaged value is replaced (text decoded, a number 0, stats or settings left out) and noted;
# a message row that cannot be a message (unknown role, no text) is left out and noted. The notes
# travel with the result; the caller decides who hears them.


class _Row:
    """One row's values, read with a note for each that had to be replaced."""

    def __init__(self, where: str):
        self.where = where
        self.notes: list[str] = []

    def note(self, what: str) -> None:
        self.notes.append(f"{self.where}: {what}")

    def text(self, value: Any, column: str, *, optional: bool = False) -> str | None:
        if isinstance(value, str) or (value is None and optional):
            return value
        if isinstance(value, bytes):
            self.note(f"{column} was stored as bytes; decoded")
            return value.decode("utf-8", "replace")
        if value is None:
            self.note(f"{column} missing")
            return None
        self.note(f"{column} was stored as a number; shown as text")
        return str(value)

    def seconds(self, value: Any, column: str) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= LATEST_TIME_S:
            return float(value)
        self.note(f"{column} is not a time ({_shown(value)}); shown as 0")
        return 0.0

    def mapping(self, value: Any, column: str) -> dict[str, Any] | None:
        """A JSON object column: None when empty, damaged (noted) or not an object (noted)."""
        if value is None or value == "":
            return None
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str) or len(value) > MAX_JSON_CHARS:
            self.note(f"{column} is not JSON text of at most {MAX_JSON_CHARS} characters; left out")
            return None
        try:
            parsed = parse_json(value, column)
        except StoredFileError as exc:
            self.note(f"{exc}; left out")
            return None
        if not isinstance(parsed, dict):
            self.note(f"{column} is not a JSON object; left out")
            return None
        return parsed


def _shown(value: Any) -> str:
    return repr(value)[:40]


def _summary_from_row(r: tuple) -> ConversationSummary:
    row = _Row(f"conversation {r[0]}")
    title = row.text(r[1], "title") or ""
    model = row.text(r[2], "model") or ""
    updated_at = row.seconds(r[3], "updated_at")
    return ConversationSummary(int(r[0]), title, model, updated_at, int(r[4]), tuple(row.notes))


def _conversation_from_rows(c: tuple, msgs: list[tuple]) -> Conversation:
    row = _Row(f"conversation {c[0]}")
    messages, notes = [], []
    for m in msgs:
        message = _message_from_row(m, c[0], notes)
        if message is not None:
            messages.append(message)
    conv = Conversation(
        id=int(c[0]),
        title=row.text(c[1], "title") or "",
        model=row.text(c[2], "model") or "",
        system=row.text(c[3], "system", optional=True),
        settings=_settings(row, c[4]),
        created_at=row.seconds(c[5], "created_at"),
        updated_at=row.seconds(c[6], "updated_at"),
        messages=tuple(messages),
    )
    return replace(conv, notes=tuple(row.notes + notes))


def _settings(row: _Row, value: Any) -> dict[str, Any]:
    """The stored settings, each a JSON scalar (a nested value is left out and noted)."""
    settings = row.mapping(value, "settings_json") or {}
    kept = {k: v for k, v in settings.items() if v is None or isinstance(v, (str, int, float, bool))}
    if len(kept) != len(settings):
        row.note(f"settings {', '.join(sorted(set(settings) - set(kept)))} not plain values; left out")
    return kept


def _message_from_row(m: tuple, conversation_id: Any, notes: list[str]) -> StoredMessage | None:
    """One message (id, role, content, finish_reason, stats_json, created_at); None when it cannot be one."""
    row = _Row(f"conversation {conversation_id} message {m[0]}")
    role = row.text(m[1], "role")
    content = row.text(m[2], "content")
    if role not in _ROLES or content is None:
        notes.append(f"{row.where}: not a message (role {_shown(m[1])}, content {_shown(m[2])[:20]}); left out")
        return None
    finish_reason = row.text(m[3], "finish_reason", optional=True)
    stats = row.mapping(m[4], "stats_json")
    created_at = row.seconds(m[5], "created_at")
    notes.extend(row.notes)
    return StoredMessage(int(m[0]), role, content, finish_reason, stats, created_at)


def _title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _TITLE_CHARS else line[: _TITLE_CHARS - 1] + "…"


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)


def to_markdown(conv: Conversation) -> str:
    lines = [f"# {conv.title or f'Conversation {conv.id}'}", ""]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.created_at))
    lines += [f"- model: `{conv.model}`", f"- started: {when}"]
    if conv.system:
        lines.append(f"- system prompt: {conv.system}")
    if conv.settings:
        lines.append("- settings: " + ", ".join(f"{k}={v}" for k, v in conv.settings.items()))
    for m in conv.messages:
        if m.role == "note":
            lines += ["", f"> {m.content}"]
            continue
        lines += ["", f"## {m.role.capitalize()}", "", m.content]
        if m.role == "assistant":
            lines += ["", f"*{stats_footer(m.stats, m.finish_reason)}*"]
    return "\n".join(lines) + "\n"
