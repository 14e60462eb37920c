"""Where artifact bytes live: a directory on local disk (default) or an S3-compatible bucket
(boto3; any endpoint: AWS, MinIO, Ceph, moto). Objects are named by a storage key
`{tenant}/{memory id}/{artifact id}` made here, never from a client's filename, so no request
can name a path. The calls block (file and HTTP I/O): async callers run them in a thread."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from shared.settings import CommonSettings

# Ids that may appear in a storage key: fragment ids (frag-<hex>), artifact ids, key ids.
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,199}$")
MASTER_TENANT = "master"  # key ids are hex, so never "master"


class ArtifactMissing(Exception):
    """The storage holds no object under the key (deleted behind the row's back)."""


class StorageUnavailable(Exception):
    """The backend did not answer (S3 down, disk error, a backend that is not configured)."""


def _component(value: str) -> str:
    """An id as a path component: itself when plainly safe, else its digest (ids imported
    from elsewhere may hold any character; the name only has to be stable and unique)."""
    if _SAFE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def storage_key(key_id: str | None, fragment_id: str, artifact_id: str) -> str:
    return "/".join(_component(part) for part in (key_id or MASTER_TENANT, fragment_id, artifact_id))


class ArtifactStorage(Protocol):
    backend: str

    def put(self, key: str, data: bytes, content_type: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def delete(self, key: str) -> None: ...
    def exists(self, key: str) -> bool: ...


class DiskStorage:
    backend = "disk"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError("storage key escapes the artifacts directory")
        return path

    def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written whole or not at all: a reader never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageUnavailable(f"disk: {exc.__class__.__name__}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ArtifactMissing(key) from None
        except OSError as exc:
            raise StorageUnavailable(f"disk: {exc.__class__.__name__}") from exc

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
            # Empty memory / tenant directories go too (never above the root).
            for parent in (path.parent, path.parent.parent):
                if parent != self.root and parent.is_relative_to(self.root):
                    try:
                        parent.rmdir()
                    except OSError:  # not empty (or gone): nothing more to tidy
                        break
        except OSError as exc:
            raise StorageUnavailable(f"disk: {exc.__class__.__name__}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


class S3Storage:
    backend = "s3"

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket
        self._bucket_checked = False

    def _ensure_bucket(self) -> None:
        """Create the bucket on first use when it does not exist (a fresh MinIO / dev setup)."""
        if self._bucket_checked:
            return
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise
            self.client.create_bucket(Bucket=self.bucket)
        self._bucket_checked = True

    def _call(self, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._ensure_bucket()
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ArtifactMissing(kwargs.get("Key", "")) from None
            raise StorageUnavailable(f"s3: {code}") from exc
        except BotoCoreError as exc:
            raise StorageUnavailable(f"s3: {exc.__class__.__name__}") from exc

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self._call("put_object", Key=key, Body=data, ContentType=content_type)

    def get(self, key: str) -> bytes:
        body: bytes = self._call("get_object", Key=key)["Body"].read()
        return body

    def delete(self, key: str) -> None:
        self._call("delete_object", Key=key)  # S3 answers 204 for a key that is not there

    def exists(self, key: str) -> bool:
        try:
            self._call("head_object", Key=key)
        except ArtifactMissing:
            return False
        return True


@dataclass(frozen=True)
class StorageConfig:
    """The settings that choose a backend (hashable: one client per process and config)."""

    directory: str
    bucket: str | None
    endpoint: str | None
    region: str
    access_key: str | None
    secret_key: str | None

    @classmethod
    def of(cls, settings: CommonSettings) -> StorageConfig:
        return cls(
            settings.artifacts_dir, settings.artifacts_s3_bucket, settings.artifacts_s3_endpoint,
            settings.artifacts_s3_region, settings.artifacts_s3_access_key, settings.artifacts_s3_secret_key,
        )


class Storages:
    """The backend new artifacts go to, and every configured backend by name (rows name the
    backend that holds them, so artifacts stored before a switch to S3 stay readable)."""

    def __init__(self, config: StorageConfig) -> None:
        self.disk = DiskStorage(config.directory)
        self.s3: S3Storage | None = None
        if config.bucket:
            import boto3
            from botocore.config import Config

            client = boto3.client(
                "s3", endpoint_url=config.endpoint, region_name=config.region,
                aws_access_key_id=config.access_key, aws_secret_access_key=config.secret_key,
                # Bounded: a hung store costs a request seconds, not minutes.
                config=Config(signature_version="s3v4", connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}),
            )
            self.s3 = S3Storage(client, config.bucket)

    @property
    def current(self) -> ArtifactStorage:
        return self.s3 if self.s3 is not None else self.disk

    def named(self, backend: str) -> ArtifactStorage:
        if backend == "s3":
            if self.s3 is None:
                raise StorageUnavailable("s3: this artifact is in S3 and ARTIFACTS_S3_BUCKET is not set")
            return self.s3
        return self.disk


@lru_cache(maxsize=4)
def _storages(config: StorageConfig) -> Storages:
    return Storages(config)


def storages_for(settings: CommonSettings) -> Storages:
    """This process's storages for the settings (built on first use, then reused)."""
    return _storages(StorageConfig.of(settings))
