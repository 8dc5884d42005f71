#!/usr/bin/env bash
# Runs firedrill's Kubernetes flows against a throwaway kind cluster (needs docker, kind, kubectl).
# The upstream CRDs come from $FIREDRILL_CRD_DIR (default: ../shared/reference/crds); Chaos Mesh's
# controllers are not installed, so a Workflow is stored and deleted but injects nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${FIREDRILL_KIND_CLUSTER:-firedrill-e2e}
CRDS=${FIREDRILL_CRD_DIR:-../shared/reference/crds}
KUBECONFIG_FILE=$(mktemp)
trap 'kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; rm -f "$KUBECONFIG_FILE"' EXIT
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 120s
export KUBECONFIG=$KUBECONFIG_FILE
for crd in "$CRDS"/*.yaml; do kubectl apply --server-side -f "$crd" >/dev/null; done
# the workloads' namespaces the Roles live in exist before firedrill is installed
for ns in chaos-system serve train router agents; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
done
docker build -t ghcr.io/firedrill/firedrill:0.1.0 -f deploy/Dockerfile .
kind load docker-image ghcr.io/firedrill/firedrill:0.1.0 --name "$CLUSTER"
kubectl apply -k deploy/base
FIREDRILL_E2E_KUBECONFIG=$KUBECONFIG_FILE ${PYTEST:-pytest} -q tests/adapters/kubernetes/test_live_cluster.py
