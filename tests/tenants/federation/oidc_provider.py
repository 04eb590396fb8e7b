"""A small but real OpenID Connect provider for the tests (Flask + joserfc, served on
loopback): discovery, JWKS, the authorization endpoint (which insists on a PKCE S256
challenge), the token endpoint (which checks the client's secret and the verifier) and
RS256-signed ID tokens. ``nonce`` and ``state`` can be made wrong on purpose."""

import base64
import hashlib
import secrets
import threading
import time
from urllib.parse import urlencode

from flask import Flask, jsonify, redirect, request
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from werkzeug.serving import make_server


class Provider:
    def __init__(self, *, port: int, client_id: str, client_secret: str, claims: dict):
        self.issuer = f"http://127.0.0.1:{port}"
        self.client_id, self.client_secret = client_id, client_secret
        self.claims = claims
        self.key = RSAKey.generate_key(2048, parameters={"kid": "test-key", "use": "sig"})
        self.codes: dict[str, dict] = {}
        self.wrong_nonce = False
        self.wrong_state = False
        self.seen_challenges: list[str] = []
        self.app = self._app()
        self.server = make_server("127.0.0.1", port, self.app, threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()

    def _app(self):
        app = Flask("test-oidc-provider")

        @app.get("/.well-known/openid-configuration")
        def discovery():
            return jsonify(
                issuer=self.issuer,
                authorization_endpoint=f"{self.issuer}/authorize",
                token_endpoint=f"{self.issuer}/token",
                jwks_uri=f"{self.issuer}/jwks",
                response_types_supported=["code"],
                subject_types_supported=["public"],
                id_token_signing_alg_values_supported=["RS256"],
                code_challenge_methods_supported=["S256"],
                token_endpoint_auth_methods_supported=["client_secret_basic"],
            )

        @app.get("/jwks")
        def jwks():
            return jsonify(KeySet([self.key]).as_dict(private=False))

        @app.get("/authorize")
        def authorize():
            args = request.args
            if args.get("client_id") != self.client_id or args.get("response_type") != "code":
                return "bad client or response type", 400
            if args.get("code_challenge_method") != "S256" or not args.get("code_challenge"):
                return "PKCE (S256) is required", 400
            self.seen_challenges.append(args["code_challenge"])
            code = secrets.token_urlsafe(16)
            self.codes[code] = {
                "challenge": args["code_challenge"],
                "nonce": args.get("nonce"),
                "redirect_uri": args["redirect_uri"],
            }
            state = "forged-state" if self.wrong_state else args.get("state")
            return redirect(f"{args['redirect_uri']}?{urlencode({'code': code, 'state': state})}")

        @app.post("/token")
        def token():
            auth = request.authorization
            if not auth or (auth.username, auth.password) != (self.client_id, self.client_secret):
                return jsonify(error="invalid_client"), 401
            grant = self.codes.pop(request.form.get("code", ""), None)
            if grant is None or request.form.get("redirect_uri") != grant["redirect_uri"]:
                return jsonify(error="invalid_grant"), 400
            verifier = request.form.get("code_verifier", "")
            digest = hashlib.sha256(verifier.encode()).digest()
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
                return jsonify(error="invalid_grant", error_description="PKCE check failed"), 400
            now = int(time.time())
            claims = {
                "iss": self.issuer,
                "aud": self.client_id,
                "iat": now,
                "exp": now + 300,
                "nonce": "a-nonce-of-another-login" if self.wrong_nonce else grant["nonce"],
                **self.claims,
            }
            id_token = jwt.encode({"alg": "RS256", "kid": "test-key"}, claims, self.key)
            return jsonify(
                access_token=secrets.token_urlsafe(16),
                token_type="Bearer",
                expires_in=300,
                id_token=id_token,
            )

        return app
