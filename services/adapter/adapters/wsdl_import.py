"""Load a WSDL with zeep (offline by default) and map every loading failure to a structured error."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from lxml import etree
from zeep import Settings
from zeep.exceptions import Error as ZeepError
from zeep.exceptions import XMLParseError, XMLSyntaxError
from zeep.wsdl import Document

from libs.errors import Unavailable, ValidationFailed
from services.adapter.adapters.wsdl_loader import DocumentRefused, OfflineTransport

__all__ = ["LoadedWsdl", "WsdlSource", "load_wsdl", "upload_location"]


@dataclass(frozen=True)
class WsdlSource:
    """Exactly one of url, document, path; `documents` holds companions keyed by absolute location."""

    url: str = ""
    document: bytes = b""
    path: str = ""
    base_url: str = ""  # where an uploaded document lives, so relative imports resolve
    documents: dict[str, bytes] = field(default_factory=dict)

    def field_name(self) -> str:
        return "url" if self.url else "path" if self.path else "document"


@dataclass
class LoadedWsdl:
    document: Document
    location: str
    documents: dict[str, bytes]  # every document read, to store and re-import offline
    wsdl_hash: str
    warnings: list[str]


def upload_location(backend_id: str) -> str:
    """Where an uploaded document without a base URL is said to live (relative imports resolve beside it)."""
    return f"file:///mnemesh-upload/{backend_id}/service.wsdl"


def _hash(documents: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for location in sorted(documents):
        digest.update(location.encode() + b"\0" + hashlib.sha256(documents[location]).digest())
    return digest.hexdigest()


def load_wsdl(source: WsdlSource, backend_id: str, *, allow_remote: bool = False,
              file_roots: tuple[Path, ...] | None = (), timeout: float = 30.0) -> LoadedWsdl:
    """Blocking (zeep parses synchronously): run it in a worker thread."""
    given = [bool(source.url), bool(source.document), bool(source.path)]
    if sum(given) != 1:
        raise ValidationFailed("give exactly one of url, document or path", field="source",
                               hint="url: fetched by the adapter; document: the WSDL text; path: a file on the adapter")
    documents = dict(source.documents)
    if source.url:
        if urlsplit(source.url).scheme not in ("http", "https", "file"):
            raise ValidationFailed(f"{source.url!r} is not an http(s) or file URL", field="url")
        location = source.url
    elif source.path:
        location = Path(source.path).resolve().as_uri()
    else:
        location = source.base_url or upload_location(backend_id)
        documents[location] = source.document
    transport = OfflineTransport(documents=documents, origin=location, allow_remote=allow_remote,
                                 file_roots=file_roots, timeout=timeout)
    settings = Settings(strict=True, xml_huge_tree=False, forbid_dtd=True, forbid_entities=True)
    field_name = source.field_name()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            document = Document(location, transport, settings=settings)
        except DocumentRefused as exc:
            if exc.location == location and source.url and "cannot be fetched" in exc.reason:
                raise Unavailable(f"the WSDL {exc.reason}", field=field_name, hint=exc.hint) from None
            what = "the WSDL" if exc.location == location else f"the import {exc.location}"
            raise ValidationFailed(f"{what} {exc.reason}", field=field_name, hint=exc.hint) from None
        except (XMLSyntaxError, etree.XMLSyntaxError) as exc:
            raise ValidationFailed(f"a document is not well-formed XML: {getattr(exc, 'message', exc)}",
                                   field=field_name, hint="check that the URL or file really holds a WSDL") from None
        except XMLParseError as exc:
            where = f" ({exc.filename}, line {exc.sourceline})" if exc.filename else ""
            raise ValidationFailed(f"the WSDL or one of its schemas is invalid{where}: {exc.message}",
                                   field=field_name, hint="fix the document; the adapter names the first problem") \
                from None
        except ZeepError as exc:
            raise ValidationFailed(f"the WSDL cannot be loaded: {exc.__class__.__name__}: {exc}",
                                   field=field_name, hint="check the document and its imports") from None
        except (KeyError, AttributeError, IndexError, TypeError, ValueError) as exc:
            # zeep trips on some malformed documents with plain Python errors; say so instead of a 500.
            raise ValidationFailed(f"the WSDL cannot be loaded: {exc.__class__.__name__}: {exc}",
                                   field=field_name, hint="is it a WSDL 1.1 document? (WSDL 2.0 is not supported)") \
                from None
    notes = [str(w.message) for w in caught]
    loaded = dict(transport.loaded)
    if not any(document.services.values()):
        raise ValidationFailed("the WSDL declares no service (wsdl:service), so there is no endpoint to call",
                               field=field_name, hint="import the WSDL that holds the service and port definitions")
    return LoadedWsdl(document, location, loaded, _hash(loaded), notes)
