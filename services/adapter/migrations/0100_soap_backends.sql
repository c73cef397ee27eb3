-- Imported WSDLs. Backends are deployment-wide (like the gateway's tool registry): every tenant
-- calls the same ERP through the same tools, so this table has no tenant_id and no row-level
-- security; the adapter reads it with system transactions only. `documents` holds every document
-- the import read (location -> base64), so a restart re-imports without the network.
CREATE TABLE IF NOT EXISTS soap_backends (
    backend_id   text        PRIMARY KEY,
    location     text        NOT NULL,
    options      jsonb       NOT NULL,
    documents    jsonb       NOT NULL,
    wsdl_hash    text        NOT NULL,
    revision     int         NOT NULL,
    tools        jsonb       NOT NULL,
    imported_at  timestamptz NOT NULL DEFAULT now()
);
