"""Storage test helpers; the moto S3 + IAM server itself is ``tests.conftest.s3_server``."""

import boto3


def s3_client(endpoint: str, access_key: str, secret_key: str):
    """A plain boto3 S3 client, as a researcher's script makes one."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
    )
