"""A real SOAP server (spyne) for the adapter's tests and benchmark, run as a subprocess.

    python tests/integration/soap_server.py   ->  prints "PORT <n>" once listening on 127.0.0.1

Endpoints (WSDL at <path>?wsdl): /soap11 and /soap12 (the billing service, SOAP 1.1 and 1.2),
/basic11 (HTTP basic auth: clerk / s3cret), /wsse11 (WS-Security UsernameToken, text or digest:
clerk / s3cret), /broken11 (answers 200 with text that is not XML), /down11 (answers HTTP 503).
"""

from __future__ import annotations

import base64
import hashlib
import socketserver
import sys
import time
import warnings
from datetime import date, datetime, timezone
from decimal import Decimal
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

warnings.simplefilter("ignore")  # spyne 2.14 still imports py2 shims; not our code

from lxml import etree  # noqa: E402
from spyne import (  # noqa: E402
    Application,
    Array,
    ComplexModel,
    Date,
    DateTime,
    Decimal as SDecimal,
    Enum,
    Fault,
    Integer,
    Mandatory,
    ServiceBase,
    Unicode,
    rpc,
)
from spyne.protocol.soap import Soap11, Soap12  # noqa: E402
from spyne.server.wsgi import WsgiApplication  # noqa: E402

TNS = "urn:mnemesh:test:billing"
USER, PASSWORD = "clerk", "s3cret"

Status = Enum("active", "suspended", "closed", type_name="Status")


class Address(ComplexModel):
    __namespace__ = TNS
    street = Mandatory(Unicode)
    city = Mandatory(Unicode)
    zip = Unicode(pattern=r"[0-9]{5}")
    country = Unicode(max_len=2)


class Customer(ComplexModel):
    __namespace__ = TNS
    id = Mandatory(Integer)
    name = Unicode(max_len=40, min_occurs=1)
    status = Status
    balance = SDecimal
    created = DateTime
    tags = Array(Unicode)
    address = Address
    note = Unicode(nillable=True)


Customer._type_info["referrer"] = Customer.customize(min_occurs=0)  # recursive


class InvoiceLine(ComplexModel):
    __namespace__ = TNS
    sku = Mandatory(Unicode)
    quantity = Integer(ge=1, min_occurs=1)
    unit_price = SDecimal(min_occurs=1)


class Invoice(ComplexModel):
    __namespace__ = TNS
    number = Unicode
    customer_id = Integer
    total = SDecimal
    due = Date
    lines = Array(InvoiceLine)


class CustomerNotFound(Fault):
    __namespace__ = TNS

    def __init__(self, customer_id: int) -> None:
        super().__init__("Client.CustomerNotFound", f"no customer {customer_id}",
                         detail={"customer_id": str(customer_id)})


CUSTOMERS = {
    1: dict(id=1, name="Ada Lovelace", status="active", balance=Decimal("1234.5600"),
            created=datetime(2024, 3, 1, 9, 30, tzinfo=timezone.utc), tags=["vip", "engineering"],
            address=dict(street="12 Analytical St", city="London", zip="10001", country="GB"), note=None),
    2: dict(id=2, name="Charles Babbage", status="suspended", balance=Decimal("-0.01"),
            created=datetime(2023, 12, 24, 18, 0, tzinfo=timezone.utc), tags=[],
            address=dict(street="1 Difference Rd", city="London"), note="owes a penny"),
}


def _customer(data: dict) -> Customer:
    fields = dict(data)
    fields["address"] = Address(**fields["address"])
    customer = Customer(**fields)
    if customer.id == 2:
        customer.referrer = _customer(CUSTOMERS[1])
    return customer


class BillingService(ServiceBase):
    @rpc(Mandatory(Integer), _returns=Customer, _throws=[CustomerNotFound])
    def get_customer(ctx, customer_id):
        """Returns one customer by id, with address and tags."""
        if customer_id not in CUSTOMERS:
            raise CustomerNotFound(customer_id)
        return _customer(CUSTOMERS[customer_id])

    @rpc(Status, Integer(min_occurs=0), Unicode(min_occurs=0), _returns=Array(Customer))
    def find_customers(ctx, status, limit, name_prefix):
        found = [_customer(c) for c in CUSTOMERS.values()
                 if (status is None or c["status"] == status) and c["name"].startswith(name_prefix or "")]
        return found[:limit] if limit else found

    @rpc(Mandatory(Integer), Array(InvoiceLine, min_occurs=1), Date, _returns=Invoice)
    def create_invoice(ctx, customer_id, lines, due):
        total = sum((line.quantity * line.unit_price for line in lines or []), Decimal("0"))
        return Invoice(number=f"INV-{customer_id}-{len(lines or [])}", customer_id=customer_id, total=total,
                       due=due or date(2030, 1, 1), lines=lines)

    @rpc(Unicode, Integer, _returns=Unicode)
    def slow_echo(ctx, text, delay_ms):
        time.sleep((delay_ms or 0) / 1000)
        return text

    @rpc(_returns=Unicode)
    def ping(ctx):
        return "pong"


def _app(protocol, name: str) -> WsgiApplication:
    return WsgiApplication(Application([BillingService], tns=TNS, name=name, in_protocol=protocol(validator="lxml"),
                                       out_protocol=protocol()))


def _wsse_ok(body: bytes) -> bool:
    try:
        root = etree.fromstring(body)
    except etree.XMLSyntaxError:
        return False
    ns = {"wsse": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd",
          "wsu": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"}
    token = root.find(".//wsse:UsernameToken", ns)
    if token is None or token.findtext("wsse:Username", namespaces=ns) != USER:
        return False
    password = token.find("wsse:Password", ns)
    if password is None:
        return False
    if password.get("Type", "").endswith("#PasswordDigest"):
        nonce = base64.b64decode(token.findtext("wsse:Nonce", namespaces=ns) or "")
        created = (token.findtext("wsu:Created", namespaces=ns) or "").encode()
        expected = base64.b64encode(hashlib.sha1(nonce + created + PASSWORD.encode()).digest()).decode()
        return password.text == expected
    return password.text == PASSWORD


_AUTH_FAULT = (b'<?xml version="1.0"?><soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/">'
               b"<soap:Body><soap:Fault><faultcode>soap:Client.Authentication</faultcode>"
               b"<faultstring>the security token is missing or wrong</faultstring></soap:Fault></soap:Body>"
               b"</soap:Envelope>")


def application(soap11: WsgiApplication, soap12: WsgiApplication):
    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        environ_for = dict(environ)
        if path.startswith("/soap12"):
            return soap12(environ, start_response)
        if path.startswith("/broken11") and environ["REQUEST_METHOD"] == "POST":
            start_response("200 OK", [("Content-Type", "text/xml")])
            return [b"<html><body>Internal proxy page"]
        if path.startswith("/down11") and environ["REQUEST_METHOD"] == "POST":
            start_response("503 Service Unavailable", [("Content-Type", "text/html"), ("Retry-After", "1")])
            return [b"<html>maintenance</html>"]
        if path.startswith("/basic11") and environ["REQUEST_METHOD"] == "POST":
            expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if environ.get("HTTP_AUTHORIZATION") != expected:
                start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="billing"')])
                return [b""]
        if path.startswith("/wsse11") and environ["REQUEST_METHOD"] == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            if not _wsse_ok(body):
                start_response("500 Internal Server Error", [("Content-Type", "text/xml; charset=utf-8")])
                return [_AUTH_FAULT]
            import io
            environ_for["wsgi.input"] = io.BytesIO(body)
        return soap11(environ_for, start_response)

    return app


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _Threading(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128


def main() -> None:
    app = application(_app(Soap11, "Billing"), _app(Soap12, "Billing"))
    server = make_server("127.0.0.1", 0, app, server_class=_Threading, handler_class=_Quiet)
    print(f"PORT {server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
