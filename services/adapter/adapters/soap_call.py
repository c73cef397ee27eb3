"""Call one operation of an imported SOAP port: JSON in, JSON out, structured errors, never blocking.

zeep builds the envelope (its serializer knows document/rpc, literal/encoded, SOAP 1.1/1.2,
WS-Addressing and WS-Security); the HTTP exchange is ours, on the shared `SoapHttp` session, so
that deadlines, retries, basic auth and the per-endpoint concurrency limit are explicit.
The response is parsed and faults are mapped here too, keeping the body exactly in the shape
of the generated output schema (zeep's convenience unwrapping would not).
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from types import SimpleNamespace

from jsonschema.exceptions import best_match
from lxml import etree
from requests_toolbelt.multipart.decoder import MultipartDecoder
from zeep import Settings
from zeep.exceptions import Error as ZeepError
from zeep.exceptions import Fault as ZeepFault
from zeep.loader import parse_xml
from zeep.utils import get_media_type
from zeep.wsdl.attachments import MessagePack
from zeep.wsdl.messages.xop import process_xop
from zeep.wsdl.utils import etree_to_string
from zeep.xsd.types.complex import ComplexType

from libs.errors import DeadlineExceeded, DomainError, Unavailable, ValidationFailed
from libs.safe_schema import SafeValidator
from services.adapter.adapters.soap_http import HttpReply, HttpTimeout, HttpUnreachable, SoapHttp
from services.adapter.adapters.soap_values import body_arguments, header_arguments, to_json, xml_to_json
from services.adapter.domain.catalog import Catalog, OperationTool
from services.adapter.domain.errors import BadResponse, from_http_status, from_soap_fault

__all__ = ["CallPolicy", "Credentials", "SoapEndpoint"]


@dataclass(frozen=True)
class Credentials:
    kind: str  # "basic", "wsse_text" or "wsse_digest"
    username: str
    password: str


@dataclass(frozen=True)
class CallPolicy:
    timeout_seconds: float = 30.0
    retries: int = 0  # extra attempts after a transient failure (connection refused, 502/503/504, timeout)
    backoff_seconds: float = 0.2


def _validator(schema: dict) -> SafeValidator:
    return SafeValidator(schema)  # RE2 patterns: a caller's string cannot make a regex backtrack for ever


def _schema_error(validator: SafeValidator, arguments: dict) -> ValidationFailed | None:
    err = best_match(validator.iter_errors(arguments))
    if err is None:
        return None
    # A nullable member is anyOf(schema, null): report what the non-null branch wanted.
    while err.validator in ("anyOf", "oneOf") and err.context:
        inner = [e for e in err.context if e.validator != "type" or e.validator_value != "null"]
        if not inner:
            break
        err = best_match(inner)
    where = ".".join(str(p) for p in err.absolute_path) or "(root)"
    hint = "see the tool's inputSchema"
    if err.validator == "enum":
        hint = f"use one of {', '.join(map(str, err.validator_value))}"
    elif err.validator == "required":
        hint = "add the missing member"
    elif err.validator == "pattern":
        hint = f"the value must match {err.validator_value}"
    return ValidationFailed(err.message[:300], field=where, hint=hint)


class SoapEndpoint:
    """One imported port, ready to call. Shares the process' HTTP client and endpoint limits."""

    def __init__(self, catalog: Catalog, binding, *, http: SoapHttp, limits: dict[str, asyncio.Semaphore],
                 concurrency: int, credentials: Credentials | None = None, address: str = "",
                 policies: dict[str, CallPolicy] | None = None, default_policy: CallPolicy = CallPolicy()) -> None:
        self.catalog, self.binding, self.http = catalog, binding, http
        self.address = address or catalog.port.address
        self.credentials = credentials
        self.policies, self.default_policy = policies or {}, default_policy
        self._validators = {t.name: _validator(t.input_schema) for t in catalog.tools}
        self._limit = limits.setdefault(self.address, asyncio.Semaphore(concurrency))
        self._client = SimpleNamespace(wsse=self._wsse(), plugins=[], settings=Settings(strict=True))
        self._auth = (credentials.username, credentials.password) \
            if credentials and credentials.kind == "basic" else None

    def _wsse(self):
        if not self.credentials or not self.credentials.kind.startswith("wsse"):
            return None
        from zeep.wsse.username import UsernameToken  # imported here: only WS-Security users pay for it

        return UsernameToken(self.credentials.username, self.credentials.password,
                             use_digest=self.credentials.kind == "wsse_digest")

    async def invoke(self, tool: OperationTool, arguments: dict) -> dict:
        error = _schema_error(self._validators[tool.name], arguments)
        if error:
            raise error
        operation = self.binding._operations[tool.operation]
        arguments = dict(arguments)
        headers_given = arguments.pop("_soapheaders", None)
        try:
            args, kwargs = body_arguments(operation.input.body if operation.input else None, arguments)
            if headers_given:
                kwargs["_soapheaders"] = header_arguments(getattr(operation.input, "header", None), headers_given)
            # WS-Security tokens carry a nonce and a timestamp: build the envelope once per attempt.
            envelope, headers = self.binding._create(tool.operation, args, kwargs, client=self._client,
                                                     options={"address": self.address})
        except DomainError:
            raise
        except (ZeepError, TypeError, ValueError) as exc:
            raise ValidationFailed(f"the arguments do not fit the SOAP message: {exc}", field="arguments",
                                   hint="check the types against the tool's inputSchema") from None
        policy = self.policies.get(tool.operation, self.default_policy)
        response = await self._post(etree_to_string(envelope), headers, policy)
        return self._result(operation, tool, response)

    async def _post(self, body: bytes, headers: dict, policy: CallPolicy) -> HttpReply:
        attempt = 0
        while True:
            try:
                async with self._limit:
                    response = await self.http.post(self.address, body, headers, auth=self._auth,
                                                    timeout=policy.timeout_seconds)
                if response.status in (502, 503, 504) and attempt < policy.retries:
                    raise _Transient(from_http_status(response.status, self.address))
                return response
            except HttpTimeout:
                error: DomainError = DeadlineExceeded(
                    f"the endpoint {self.address} did not answer within {policy.timeout_seconds:g} s",
                    hint="retry later, or raise the operation's timeout_seconds if it is always slow")
            except HttpUnreachable as exc:
                error = Unavailable(f"cannot reach the endpoint {self.address}: {exc}",
                                    hint="retry later; operators: check that the backend is up")
            except _Transient as exc:
                error = exc.error
            if attempt >= policy.retries:
                raise error
            attempt += 1
            await asyncio.sleep(policy.backoff_seconds * 2 ** (attempt - 1))  # exponential backoff

    def _result(self, operation, tool: OperationTool, response: HttpReply) -> dict:
        content, pack = response.content, None
        if get_media_type(response.headers.get("Content-Type", "text/xml")) == "multipart/related":
            decoder = MultipartDecoder(content, response.headers["Content-Type"], response.encoding)
            content = decoder.parts[0].content
            pack = MessagePack(parts=decoder.parts[1:]) if len(decoder.parts) > 1 else None
        if not content.strip():
            if response.status in (200, 202) and operation.output is None:
                return {}
            raise from_http_status(response.status, self.address) if response.status >= 400 else \
                BadResponse(f"the endpoint {self.address} answered an empty body", hint="report it to the backend")
        try:
            doc = parse_xml(content, None, settings=self._client.settings)
        except ZeepError:
            if response.status >= 400:
                raise from_http_status(response.status, self.address, content[:200].decode(errors="replace")) \
                    from None
            raise BadResponse(f"the endpoint {self.address} answered HTTP {response.status} with a body that "
                              "is not XML", hint="a proxy or error page may stand in front of the service") from None
        if pack is not None and process_xop(doc, pack):
            pack = None
        body = doc.find("soap-env:Body", namespaces=self.binding.nsmap)
        if body is None:
            if response.status >= 400:
                raise from_http_status(response.status, self.address)
            raise BadResponse(f"the response of {self.address} is XML but not a SOAP {self.catalog.port.soap_version} "
                              "envelope", hint="check that the endpoint speaks the WSDL's SOAP version")
        if body.find("soap-env:Fault", namespaces=self.binding.nsmap) is not None:
            raise self._fault(doc, operation, tool, response.status)
        if response.status >= 400:
            raise from_http_status(response.status, self.address)
        result = self._body(operation, body)
        if pack is not None:
            result["_attachments"] = [
                {"uri": f"data:{a.content_type or 'application/octet-stream'};base64,"
                        + base64.b64encode(a.content).decode(), "content_id": a.content_id or ""}
                for a in pack.attachments]
        return result

    def _body(self, operation, body: etree._Element) -> dict:
        message = operation.output
        if message is None or message.body is None or not len(body):
            return {}
        try:
            value = message._deserialize_body(body)["body"]
        except (ZeepError, LookupError, ValueError, TypeError, AttributeError) as exc:
            raise BadResponse(f"the response does not match the WSDL: {exc}",
                              hint="the service and the imported WSDL may have diverged: re-import it") from None
        if isinstance(message.body.type, ComplexType) and message.body.type._array_type is None:
            return to_json(value) or {}
        return {message.body.name: to_json(value)}

    def _fault(self, doc: etree._Element, operation, tool: OperationTool, status: int) -> DomainError:
        try:
            self.binding.process_error(doc, operation)
        except ZeepFault as fault:
            detail = fault.detail
            first = next((c for c in detail if isinstance(c.tag, str)), None) if detail is not None else None
            return from_soap_fault(
                code=fault.code or "", message=fault.message or "", actor=fault.actor or "",
                subcodes=tuple(getattr(q, "text", str(q)) for q in (fault.subcodes or [])),
                detail=xml_to_json(detail) if isinstance(detail, etree._Element) else detail,
                declared=tool.faults, detail_name=etree.QName(first).localname if first is not None else "",
                http_status=status)
        return BadResponse("the response holds a SOAP fault that cannot be read", hint="report it to the backend")


class _Transient(Exception):
    def __init__(self, error: DomainError) -> None:
        self.error = error
