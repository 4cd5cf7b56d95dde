"""Cluster identity minted by the program: CA, bootstrap tokens, join hash, admin credentials.

Minting them here lets the workers verify the control plane (by the CA's public-key hash)
and boot in parallel with it, and gives an admin kubeconfig without copying files."""

from __future__ import annotations

import base64

import pulumi
import pulumi_random as random
import pulumi_tls as tls

from components import bootstrap
from core import trusted_yaml
from core.names import UserRole

CA_VALIDITY_HOURS = 10 * 365 * 24
ADMIN_VALIDITY_HOURS = 365 * 24
# Bound to cluster-admin by a ClusterRoleBinding `kubeadm init` creates (revocable, unlike
# system:masters); the provider waits for the readiness gate, which comes after init.
ADMIN_GROUP = "kubeadm:cluster-admins"
ADMIN_USER = "testbed-admin"  # the program's own (the Kubernetes provider's); never a stack output
OPERATOR_USER = "testbed-operator"  # the operator's `kubeconfig` output: the same group, hours long


def render_kubeconfig(
    cluster: str,
    server: str,
    ca_cert_pem: str,
    client_cert_pem: str,
    client_key_pem: str,
    user: str = ADMIN_USER,
    namespace: str | None = None,
) -> str:
    """One cluster, one user, one context (in `namespace`, when given)."""

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return trusted_yaml.dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_cert_pem)}}
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate-data": b64(client_cert_pem), "client-key-data": b64(client_key_pem)},
                }
            ],
            "contexts": [
                {
                    "name": cluster,
                    "context": {"cluster": cluster, "user": user, **({"namespace": namespace} if namespace else {})},
                }
            ],
            "current-context": cluster,
        },
        sort_keys=False,
    )


class ClusterIdentity(pulumi.ComponentResource):
    ca_cert_pem: pulumi.Output[str]
    ca_key_pem: pulumi.Output[str]
    ca_cert_hash: pulumi.Output[str]
    bootstrap_token: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:cluster:Identity", name, None, opts)
        self._name = name
        ca_key, ca_cert = self._create_ca()
        self.ca_key_pem = pulumi.Output.secret(ca_key.private_key_pem)
        self.ca_cert_pem = ca_cert.cert_pem
        self.ca_cert_hash = ca_key.public_key_pem.apply(bootstrap.discovery_token_ca_cert_hash)
        self.bootstrap_token = self.token(f"{name}-token")
        self._ca_key, self._ca_cert = ca_key, ca_cert
        self._admin_key, self._admin_cert = self._client_credentials(
            "admin", ADMIN_USER, ADMIN_GROUP, ADMIN_VALIDITY_HOURS
        )
        self.register_outputs({"caCertPem": self.ca_cert_pem, "caCertHash": self.ca_cert_hash})

    def _create_ca(self) -> tuple[tls.PrivateKey, tls.SelfSignedCert]:
        child = pulumi.ResourceOptions(parent=self)
        key = tls.PrivateKey(f"{self._name}-ca-key", algorithm="RSA", rsa_bits=2048, opts=child)
        cert = tls.SelfSignedCert(
            f"{self._name}-ca-cert",
            private_key_pem=key.private_key_pem,
            is_ca_certificate=True,
            subject={"common_name": "kubernetes"},
            validity_period_hours=CA_VALIDITY_HOURS,
            allowed_uses=["cert_signing", "crl_signing", "digital_signature", "key_encipherment"],
            opts=child,
        )
        return key, cert

    def token(self, name: str) -> pulumi.Output[str]:
        """A bootstrap token in kubeadm's format [a-z0-9]{6}.[a-z0-9]{16}: kubeadm init's own, or
        one worker's (each worker joins with its own, so replacing one re-registers only that)."""
        child = pulumi.ResourceOptions(parent=self)
        # kubeadm's charset: lower-case letters and digits only
        token_id = random.RandomString(
            f"{name}-id", length=6, upper=False, special=False, lower=True, numeric=True, opts=child
        )
        token_secret = random.RandomPassword(
            f"{name}-secret", length=16, upper=False, special=False, lower=True, numeric=True, opts=child
        )
        return pulumi.Output.secret(pulumi.Output.concat(token_id.result, ".", token_secret.result))

    def _client_credentials(
        self, who: str, user: str, group: str, validity_hours: int, early_renewal_hours: int = 0
    ) -> tuple[tls.PrivateKey, tls.LocallySignedCert]:
        """A client certificate signed by the cluster CA: CN=`user`, O=`group`."""
        child = pulumi.ResourceOptions(parent=self)
        key = tls.PrivateKey(f"{self._name}-{who}-key", algorithm="RSA", rsa_bits=2048, opts=child)
        # The provider's subject has one `organization` (O=), a string (pulumi_tls 5.6.2 _inputs.py
        # CertRequestSubjectArgsDict; hashicorp/terraform-provider-tls subject block): the key
        # `organizations` was no field of it, so the certificate carried no group.
        subject: tls.CertRequestSubjectArgsDict = {"common_name": user, "organization": group}
        request = tls.CertRequest(
            f"{self._name}-{who}-csr",
            private_key_pem=key.private_key_pem,
            subject=subject,
            opts=child,
        )
        cert = tls.LocallySignedCert(
            f"{self._name}-{who}-cert",
            cert_request_pem=request.cert_request_pem,
            ca_private_key_pem=self._ca_key.private_key_pem,
            ca_cert_pem=self._ca_cert.cert_pem,
            validity_period_hours=validity_hours,
            early_renewal_hours=early_renewal_hours or None,  # the admin's stays as it was
            allowed_uses=["digital_signature", "key_encipherment", "client_auth"],
            opts=child,
        )
        return key, cert

    def _render(
        self,
        cluster: str,
        server_ip: pulumi.Input[str],
        port: int,
        key: tls.PrivateKey,
        cert: tls.LocallySignedCert,
        user: str,
        namespace: str | None = None,
    ) -> pulumi.Output[str]:
        return pulumi.Output.secret(
            pulumi.Output.all(server_ip, self.ca_cert_pem, cert.cert_pem, key.private_key_pem).apply(
                lambda v: render_kubeconfig(cluster, f"https://{v[0]}:{port}", v[1], v[2], v[3], user, namespace)
            )
        )

    def program_kubeconfig(self, cluster: str, server_ip: pulumi.Input[str], port: int) -> pulumi.Output[str]:
        """The program's own, for the Kubernetes provider: cluster-admin for a year, never renewed by
        `pulumi up`. A renewed certificate is unknown while `pulumi up` previews, and the provider
        replaces itself, and so every Kubernetes object it manages, when its kubeconfig is unknown
        (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go DiffConfig: "We can't tell for
        sure if a computed value has changed, so we make the conservative choice and force a
        replacement"). It adds no exposure: the state that holds it holds the CA key too."""
        return self._render(cluster, server_ip, port, self._admin_key, self._admin_cert, ADMIN_USER)

    def operator_kubeconfig(
        self, validity_hours: int, cluster: str, server_ip: pulumi.Input[str], port: int
    ) -> pulumi.Output[str]:
        """The operator's: cluster-admin, for `validity_hours`, renewed by `pulumi up` after half
        its life as the users' are (role_kubeconfig). Its own key and certificate, so renewing it
        changes no input of the provider."""
        key, cert = self._client_credentials(
            "operator", OPERATOR_USER, ADMIN_GROUP, validity_hours, early_renewal_hours=validity_hours // 2
        )
        return self._render(cluster, server_ip, port, key, cert, OPERATOR_USER)

    def role_kubeconfig(
        self, role: UserRole, validity_hours: int, cluster: str, server_ip: pulumi.Input[str], port: int
    ) -> pulumi.Output[str]:
        """A user's: what `role`'s RoleBinding grants its group, for `validity_hours`. The provider
        plans a replacement once the certificate is within its early-renewal hours of its end
        (hashicorp/terraform-provider-tls@v4.0.6 internal/provider/common_cert.go
        modifyPlanIfCertificateReadyForRenewal), so `pulumi up` issues a new one after half
        its life, and an expired one is always replaced."""
        key, cert = self._client_credentials(
            role.role, role.user, role.group, validity_hours, early_renewal_hours=validity_hours // 2
        )
        return self._render(cluster, server_ip, port, key, cert, role.user, role.namespace)
