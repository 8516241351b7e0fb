"""Bucket notifications as MinIO's webhook target sends them: one record per POST, wrapped in
``{"EventName", "Key", "Records"}``, the record in the S3 event shape with MinIO's fields,
the object key URL-encoded the way Go's ``url.QueryEscape`` does (spaces as ``+``, ``/`` as
``%2F``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote_plus


def minio_event(
    event_name: str, bucket: str, key: str, *, size: int = 0, etag: str = ""
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "key": quote_plus(key, safe=""),
        "sequencer": "1807E1F3A0B0C0D0",
    }
    if event_name.startswith("s3:ObjectCreated:"):
        obj.update(
            size=size,
            eTag=etag,
            contentType="text/markdown",
            userMetadata={"content-type": "text/markdown"},
        )
    record = {
        "eventVersion": "2.0",
        "eventSource": "minio:s3",
        "awsRegion": "",
        "eventTime": "2026-12-02T01:10:00.000Z",
        "eventName": event_name,
        "userIdentity": {"principalId": "minioadmin"},
        "requestParameters": {
            "principalId": "minioadmin",
            "region": "",
            "sourceIPAddress": "172.18.0.1",
        },
        "responseElements": {
            "x-amz-id-2": "dd9025bab4ad464b049177c95eb6ebf374d3b3fd1af9251148b658df7ac2e3e8",
            "x-amz-request-id": "1807E1F3A0B0C0D0",
            "x-minio-deployment-id": "2f6ab4c5-0e43-4b2a-9d43-a1b2c3d4e5f6",
            "x-minio-origin-endpoint": "http://172.18.0.3:9000",
        },
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "Config",
            "bucket": {
                "name": bucket,
                "ownerIdentity": {"principalId": "minioadmin"},
                "arn": f"arn:aws:s3:::{bucket}",
            },
            "object": obj,
        },
        "source": {
            "host": "172.18.0.1",
            "port": "",
            "userAgent": "MinIO (linux; amd64) minio-go/v7.0.70",
        },
    }
    return {"EventName": event_name, "Key": f"{bucket}/{key}", "Records": [record]}
