import socket

import boto3
import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 + IAM service on loopback (moto's server) that authenticates every request
    and enforces IAM policies, with an administrator's credentials: ``{endpoint,
    access_key, secret_key}``. Requests before ``reset-auth 0`` run unauthenticated; the
    administrator is made in that window."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"1000000")
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="kumo-admin")
    iam.put_user_policy(
        UserName="kumo-admin",
        PolicyName="all",
        PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*",'
        '"Resource":"*"}]}',
    )
    key = iam.create_access_key(UserName="kumo-admin")["AccessKey"]
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"0")  # from now on, every request
    yield {
        "endpoint": endpoint,
        "access_key": key["AccessKeyId"],
        "secret_key": key["SecretAccessKey"],
    }
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"inf")
    server.stop()


def s3_client(endpoint: str, access_key: str, secret_key: str):
    """A plain boto3 S3 client, as a researcher's script makes one."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
    )
