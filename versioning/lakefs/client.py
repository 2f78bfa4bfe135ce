"""The official SDK's client, set up so that retrying and timeouts are the adapter's to decide."""

from __future__ import annotations

import lakefs
import lakefs_sdk
import urllib3
from lakefs_sdk.rest import RESTClientObject

from versioning.lakefs.config import LakeFSCredentials


class _RestClient(RESTClientObject):
    """lakefs_sdk's REST client with a default timeout: it waits forever unless each call passes one."""

    def __init__(self, configuration: lakefs_sdk.Configuration, timeout: tuple[float, float]):
        super().__init__(configuration)
        self._timeout = timeout
        # ObjectWriter uploads through the pool manager directly; give its pools the same timeout.
        self.pool_manager.connection_pool_kw["timeout"] = urllib3.Timeout(*timeout)

    def request(self, *args, _request_timeout=None, **kwargs):
        return super().request(*args, _request_timeout=_request_timeout or self._timeout, **kwargs)


def sdk_client(credentials: LakeFSCredentials, timeout: tuple[float, float]) -> lakefs.Client:
    """A ``lakefs.Client`` whose requests time out after (connect, read) seconds and are never retried."""
    client = lakefs.Client(
        host=credentials.endpoint, username=credentials.access_key_id, password=credentials.secret_access_key
    )
    # urllib3 would otherwise retry some requests itself, silently and without backoff;
    # retrying happens once, in the adapter's Retrier, where writes are made idempotent.
    client.config.retries = False
    client.sdk_client.objects_api.api_client.rest_client = _RestClient(client.config, timeout)
    return client
