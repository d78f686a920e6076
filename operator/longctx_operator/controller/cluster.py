"""What a reconcile asks of the Kubernetes API: the narrow interface the controller is
written against. runtime/kube.py implements it over the API server and the watch caches;
the unit tests use an in-memory one (tests/operator/fake_cluster.py)."""

from __future__ import annotations

from typing import Any, Optional, Protocol


class KubeError(RuntimeError):
    """An API call failed for good; the message names the object and the API's reason."""


class Cluster(Protocol):
    def get(self, api_version: str, kind: str, namespace: Optional[str], name: str
            ) -> Optional[dict[str, Any]]: ...

    def list(self, api_version: str, kind: str, namespace: Optional[str],
             label_selector: Optional[dict[str, str]] = None) -> list[dict[str, Any]]: ...

    def apply_all(self, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Server-side applies; the objects as the API server answered."""
        ...

    def delete(self, api_version: str, kind: str, namespace: Optional[str], name: str
               ) -> None: ...

    def patch_metadata(self, api_version: str, kind: str, namespace: str, name: str,
                       metadata: dict[str, Any]) -> None: ...

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str,
                     status: dict[str, Any]) -> None: ...

    def crd_exists(self, name: str) -> bool: ...

    def nodes(self) -> Optional[list[dict[str, Any]]]:
        """Every Node; None when they cannot be listed (a namespaced install)."""
        ...

    def gpus_in_use(self) -> Optional[dict[str, int]]:
        """The GPUs the pods of every namespace request on each node (pods bound and not
        finished); None when they cannot be listed."""
        ...
