-- API keys of the HTTP service (`trioindex serve`): one row per key, made by `trioindex keys
-- create NAME --role ROLE`. Only the SHA-256 of the token is kept (the token is 32 random
-- bytes, so its hash needs no salt or stretching); the token itself is printed once and never
-- stored. A revoked key keeps its row (and its name) with revoked_at set, and the service,
-- which reads the row on every request, refuses it from that commit on.

CREATE TABLE api_keys (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 100),
    role        text NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    key_hash    text NOT NULL CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
