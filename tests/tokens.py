"""Every Pulumi type token the tests look for, in one place.

The strings are the contract with the engine: a resource the program registers under
another type (a renamed class, another provider module) must fail the tests that look
for it, so each check that filters by type also asserts that the type was found."""

# The stack itself: the root every component hangs from
STACK = "pulumi:pulumi:Stack"
# The stack's reference to itself (the control-plane guard reads the last deployment's settings)
STACK_REFERENCE = "pulumi:pulumi:StackReference"

# AWS (pulumi-aws)
VPC = "aws:ec2/vpc:Vpc"
SUBNET = "aws:ec2/subnet:Subnet"
INTERNET_GATEWAY = "aws:ec2/internetGateway:InternetGateway"
ROUTE_TABLE = "aws:ec2/routeTable:RouteTable"
ROUTE_TABLE_ASSOCIATION = "aws:ec2/routeTableAssociation:RouteTableAssociation"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
INSTANCE = "aws:ec2/instance:Instance"
EIP = "aws:ec2/eip:Eip"
EIP_ASSOCIATION = "aws:ec2/eipAssociation:EipAssociation"
KEY_PAIR = "aws:ec2/keyPair:KeyPair"
AWS_PROVIDER = "pulumi:providers:aws"
# The evidence workspace and the control node's role (managedPrometheus), the budget (budgetMonthlyUsd)
AMP_WORKSPACE = "aws:amp/workspace:Workspace"
IAM_ROLE = "aws:iam/role:Role"
IAM_ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"
BUDGET = "aws:budgets/budget:Budget"
# Invokes
GET_AMI = "aws:ec2/getAmi:getAmi"
GET_INSTANCE_TYPE_OFFERINGS = "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"
GET_CALLER_IDENTITY = "aws:index/getCallerIdentity:getCallerIdentity"

# Cluster identity (pulumi-tls, pulumi-random)
PRIVATE_KEY = "tls:index/privateKey:PrivateKey"
SELF_SIGNED_CERT = "tls:index/selfSignedCert:SelfSignedCert"
CERT_REQUEST = "tls:index/certRequest:CertRequest"
LOCALLY_SIGNED_CERT = "tls:index/locallySignedCert:LocallySignedCert"
RANDOM_STRING = "random:index/randomString:RandomString"
RANDOM_PASSWORD = "random:index/randomPassword:RandomPassword"

# Remote steps (pulumi-command)
COMMAND = "command:remote:Command"

# Kubernetes (pulumi-kubernetes)
KUBERNETES_PROVIDER = "pulumi:providers:kubernetes"
RELEASE = "kubernetes:helm.sh/v3:Release"
PERSISTENT_VOLUME = "kubernetes:core/v1:PersistentVolume"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
# RBAC: the HPC and AI users' roles (components/user_roles.py), KEDA's scraper binding
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
# The AI run limit (components/ai_run_limit.py): its component, policies and bindings
AI_RUN_LIMIT = "testbed:platform:AiRunLimit"
VALIDATING_ADMISSION_POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VALIDATING_ADMISSION_POLICY_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
# Tenants' volumes (components/tenant_volumes.py)
TENANT_VOLUMES = "testbed:platform:TenantVolumes"
# The fair-share controller (components/fair_share_controller.py): its component and workload
FAIR_SHARE_CONTROLLER = "testbed:platform:FairShareController"
NAMESPACE = "kubernetes:core/v1:Namespace"
SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
# The runnable-jobs exporter (components/runnable_exporter.py): its component, Token and scrape
RUNNABLE_EXPORTER = "testbed:platform:RunnableExporter"
SLURM_TOKEN = "kubernetes:slinky.slurm.net/v1beta1:Token"
SERVICE = "kubernetes:core/v1:Service"
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"

# Every AWS type the default program registers: a new one must come with its checks.
AWS_TYPES = frozenset(
    {
        VPC,
        SUBNET,
        INTERNET_GATEWAY,
        ROUTE_TABLE,
        ROUTE_TABLE_ASSOCIATION,
        SECURITY_GROUP,
        INSTANCE,
        EIP,
        EIP_ASSOCIATION,
    }
    | {KEY_PAIR}
    | {AMP_WORKSPACE, IAM_ROLE, IAM_ROLE_POLICY, INSTANCE_PROFILE}
)
EVIDENCE_TYPES = frozenset({AMP_WORKSPACE, IAM_ROLE, IAM_ROLE_POLICY, INSTANCE_PROFILE})
