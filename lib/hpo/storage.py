"""Where a study lives and how it is opened: its name and directory, its storage (an SQLite file in the study
directory by default, or any SQLAlchemy URL: HPO_STORAGE=), URLs shown with their passwords redacted, and the
pruner and sampler a study is opened with."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import sys
import time
import warnings
import zlib
from pathlib import Path

import optuna

from ..config import Config
from ..errors import KfitError
from ..redact import redact as redact_line, shown
from ..models.registry import label as model_label

HEARTBEAT_S, HEARTBEAT_GRACE_S = 60, 300
# objective (CONFIG_HPO_OBJECTIVE_*) -> (what lines call it, the study's direction)
OBJECTIVES = {"eval_loss": ("eval loss", "minimize"), "accuracy": ("accuracy", "maximize"),
              "macro_f1": ("macro-F1", "maximize")}
# How long a worker waits for a storage another connection holds locked (SQLite's busy timeout, and the
# retries that mark a trial failed after it) before giving up with one error line.
LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def no_experimental_warning():
    """Optuna still flags PatientPruner (2.8) and storage heartbeats (2.9) as experimental: noise on every run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class HyperbandWithPatience(optuna.pruners.HyperbandPruner):
    """Hyperband that also prunes a trial whose value has not improved for `patience` reports."""

    def __init__(self, *, patience: int, **hyperband) -> None:
        super().__init__(**hyperband)
        with no_experimental_warning():
            self.patience = optuna.pruners.PatientPruner(None, patience)

    def prune(self, study, trial) -> bool:
        return super().prune(study, trial) or self.patience.prune(study, trial)


def make_pruner(config: Config) -> optuna.pruners.HyperbandPruner:
    hyperband = dict(min_resource=config.hpo_min_resource, max_resource=config.hpo_max_resource,
                     reduction_factor=config.hpo_reduction_factor, bootstrap_count=config.hpo_bootstrap_count)
    if config.hpo_patience > 0:
        return HyperbandWithPatience(patience=config.hpo_patience, **hyperband)
    return optuna.pruners.HyperbandPruner(**hyperband)


def study_name(config: Config) -> str:
    name = config.hpo_study_name or model_label(config)
    if "/" in name or os.sep in name:  # it names the directory hpo-<name>
        raise KfitError(f"study name {name!r} (HPO_STUDY= or CONFIG_HPO_STUDY_NAME) has a '/': name it without one")
    return name


# Query parameters that carry a secret (libpq's password, sslpassword; pymysql's passwd; tokens).
_SECRET_PARAM = r"[^=&\s#?;]*(?:pass|pwd|secret|token)[^=&\s#?;]*"


def url_secrets(url: str) -> list[str]:
    """The password and secret query values of a database URL, as SQLAlchemy's make_url reads them and as
    written (percent-encoded or not); [] where it does not parse."""
    import urllib.parse

    import sqlalchemy.engine
    import sqlalchemy.exc

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        return []
    found = [parsed.password] if parsed.password else []
    if parsed.username and not parsed.password and parsed.drivername in ("http", "https"):
        found.append(parsed.username)  # a web URL's lone user part is a token (https://TOKEN@host)
    raw = re.match(r"[\w+.-]+://[^:/]*:([^@]*)@", url)  # make_url's own split: the password up to the first @
    if raw:
        found.append(raw[1])
    for key, value in parsed.query.items():
        if re.fullmatch(_SECRET_PARAM, key, re.I):
            found.extend(value if isinstance(value, tuple) else [value])
    if "?" in url:
        for pair in url.split("?", 1)[1].split("&"):
            key, _, value = pair.partition("=")
            if re.fullmatch(_SECRET_PARAM, key, re.I):
                found.append(value)
    forms = {form for s in found if s for form in (s, urllib.parse.quote(s, safe=""), urllib.parse.quote_plus(s))}
    return sorted(forms, key=len, reverse=True)  # longest first: a secret holding another is hidden whole


def checked_storage(url: str | None) -> str | None:
    """HPO_STORAGE as given, or None; a KfitError that never shows it where SQLAlchemy cannot parse it as a
    database URL (user:password@host without a scheme, a leading //): its password could not be found to hide."""
    import sqlalchemy.engine
    import sqlalchemy.exc

    if not url:
        return None
    try:
        sqlalchemy.engine.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        raise KfitError("HPO_STORAGE=(not shown: it may hold a password) is not a database URL SQLAlchemy reads: "
                        "give dialect+driver://user:password@host/database (postgresql+psycopg2://...@db-host/optuna) "
                        "or sqlite:///path/study.db") from None
    return url


def redact(text: str, url: str | None = None) -> str:
    """`text` with every password of a database URL in it shown as ***: user:***@host, ?password=***.

    The secrets of `url` (else of `text` itself, where it is a URL) are hidden wherever they appear,
    as SQLAlchemy parses them (spaces, percent-encoded characters, query parameters); then any other URL's
    user:password@ (greedy up to the last @ of the word, as a password may hold an unescaped @: SQLAlchemy
    splits at the first one, so hiding more is safe, hiding less would show the rest) and secret query
    parameters (password=, sslpassword=, passwd=, ...)."""
    for secret in url_secrets(url if url is not None else text.strip()):
        if len(secret) >= 4:  # a shorter one would hide letters of the message; the patterns below hide it
            text = text.replace(secret, "***")
    return redact_line(text)  # any other URL's user:password@ and secret parameters (lib/redact.py)


def study_dir(config: Config, storage: str | None = None) -> Path:
    """The study's trial directories (and default SQLite file): one per (storage, study), so a study of the
    same name in another HPO_STORAGE never writes into this one's trial-NNNN."""
    name = f"hpo-{study_name(config)}"
    if storage:
        name += "-" + hashlib.sha256(redact(storage).encode()).hexdigest()[:8]
    return Path(config.output_dir) / name


def storage_url(config: Config, url: str | None = None) -> str:
    """`url` (HPO_STORAGE), else the SQLite file in the study directory."""
    return url or f"sqlite:///{(study_dir(config) / 'study.db').resolve()}"


def storage_label(url: str, given: bool) -> str:
    return f"HPO_STORAGE={redact(url)}" if given else url


def _storage_error(url: str, given: bool, reason: object, fix: str) -> KfitError:
    reason = " ".join(str(reason).split())  # driver messages can span lines
    return KfitError(redact(f"{storage_label(url, given)}: {reason}: {fix}", url))


_URL_FIX = ("give a SQLAlchemy URL such as sqlite:////abs/path/study.db or postgresql+psycopg2://user@host/db, "
            "or leave HPO_STORAGE unset for the study's own SQLite file")


def _sqlite_file(url: str, given: bool) -> Path | None:
    """The file of an SQLite URL (None for a server or in-memory SQLite); a URL that does not parse is
    a KfitError saying how to write one."""
    import sqlalchemy.engine
    import sqlalchemy.exc

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError) as err:  # ValueError: a port that is not a number
        raise _storage_error(url, given, f"not a database URL ({shown(' '.join(str(err).split()), 120)})", _URL_FIX) \
            from None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _storage(url: str, given: bool) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage, with a heartbeat: the trial of a worker that died (killed, machine lost) is
    marked failed after HEARTBEAT_GRACE_S instead of showing as running forever.

    Workers starting together on a new database race to create its tables (one fails with "table
    already exists"; optuna/optuna#1092): by then the tables exist, so try again.
    """
    import sqlalchemy.exc

    file = _sqlite_file(url, given)
    # SQLite waits this long for another connection's lock (the driver's default is 5 s), then fails
    engine = {"connect_args": {"timeout": LOCK_WAIT_S}} if url.startswith("sqlite") else None
    for attempt in range(5):
        try:
            with no_experimental_warning():
                return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=HEARTBEAT_GRACE_S)
        except sqlalchemy.exc.ArgumentError as err:  # an unknown dialect: foo://
            raise _storage_error(url, given, f"not a database SQLAlchemy knows ({err})", _URL_FIX) from None
        except ImportError as err:  # Optuna's, from the driver's ModuleNotFoundError
            module = getattr(err.__cause__, "name", None) or "?"
            package = {"psycopg2": "psycopg2-binary", "psycopg": "'psycopg[binary]'",
                       "MySQLdb": "mysqlclient"}.get(module, module)
            raise _storage_error(
                url, given, f"its database driver ({module}) is not installed",
                f"install it into kfit's environment ({sys.executable} -m pip install {package}), or name an "
                "installed driver in the URL (dialect+driver://...)") from None
        except sqlalchemy.exc.DBAPIError as err:
            if attempt < 4:
                time.sleep(0.2 * (attempt + 1))
                continue
            fix = (f"create the directory {file.parent}, or give a path in an existing one"
                   if file and not file.parent.is_dir() else
                   f"check the file {file} (a writable Optuna database)" if file else
                   "check the host, port, database name and credentials, and that the server is running")
            raise _storage_error(url, given, f"cannot open the database ({err.orig})", fix) from None


def storage_failure(err: BaseException) -> BaseException | None:
    """The storage's failure behind `err` (SQLAlchemy's database error, else Optuna's StorageInternalError),
    searched through its causes and contexts: Optuna's own cleanup can fail on the same lock and raise
    something else (an UnboundLocalError in optuna 4-5's _run_trial); None when storage is not to blame."""
    import sqlalchemy.exc

    found, seen = None, set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, sqlalchemy.exc.DBAPIError):
            return err
        if isinstance(err, optuna.exceptions.StorageInternalError):
            found = found or err
        err = err.__cause__ or err.__context__
    return found


def storage_reason(err: BaseException) -> str:
    """One line of why the storage failed: the driver's message where there is one ("database is locked")."""
    reason = getattr(err, "orig", None) or err.__cause__ or err
    return " ".join(str(reason).split())[:200]


def open_study(config: Config, storage: str | None = None, *, create: bool = True) -> optuna.Study:
    """The study in `storage` (created on first use when `create`), with the config's pruner and a seeded TPE.

    The sampler's seed is the config's SEED plus the trials already stored, so
    a second invocation does not redraw the first one's samples, and a run
    from scratch repeats exactly. Workers sharing a database also mix in
    their host and process, or they would all draw the same trials.
    """
    url, given = storage_url(config, storage), bool(storage)
    missing = KfitError(redact(f"no study '{study_name(config)}' in {storage_label(url, given)}: run 'make hpo' first"
                               + (" with this HPO_STORAGE, or correct it" if given else ""), url))
    file = _sqlite_file(url, given)
    if not create and file and not file.is_file():
        raise missing  # and do not leave an empty database behind
    if not given:
        study_dir(config).mkdir(parents=True, exist_ok=True)
    try:
        study = optuna.create_study(storage=_storage(url, given), study_name=study_name(config),
                                    direction=OBJECTIVES[config.hpo_objective][1],
                                    pruner=make_pruner(config), load_if_exists=True) \
            if create else optuna.load_study(study_name=study_name(config), storage=_storage(url, given),
                                             pruner=make_pruner(config))
    except KeyError:
        raise missing from None
    seed = config.seed + len(study.trials)
    if storage:
        seed += zlib.crc32(f"{socket.gethostname()}-{os.getpid()}".encode())
    study.sampler = optuna.samplers.TPESampler(seed=seed % 2**32)
    return study
