#!/usr/bin/env bash
# Regenerates the committed Grafana JSON schemas from npm @grafana/schema (the TypeScript types
# Grafana itself ships) with ts-json-schema-generator. Run by hand when bumping the version; the
# tests only read the committed *.schema.json files, so CI needs no npm.
#   dashboard.schema.json                 classic dashboard JSON model (raw/dashboard/x: Dashboard)
#   panel-<type>-options.schema.json      panel `options` for the panel types our dashboards use
#   panel-timeseries-fieldconfig.schema.json  `fieldConfig.defaults.custom` of timeseries panels
# ts-json-schema-generator emits additionalProperties:false, so a typo in a key fails validation.
set -euo pipefail
GRAFANA_SCHEMA=13.2.3
GENERATOR=2.4.0
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm init -y >/dev/null
npm install --no-audit --no-fund -s "@grafana/schema@$GRAFANA_SCHEMA" "ts-json-schema-generator@$GENERATOR" typescript >/dev/null
types=node_modules/@grafana/schema/dist/types/raw
gen() { npx ts-json-schema-generator --no-type-check --path "$1" --type "$2" -o "$3"; }
gen "$types/dashboard/x/types.gen.d.ts" Dashboard "$here/dashboard.schema.json"
for panel in timeseries stat bargauge table; do
  gen "$types/composable/$panel/panelcfg/x/types.gen.d.ts" Options "$here/panel-$panel-options.schema.json"
done
gen "$types/composable/timeseries/panelcfg/x/types.gen.d.ts" FieldConfig "$here/panel-timeseries-fieldconfig.schema.json"
echo "schemas regenerated from @grafana/schema@$GRAFANA_SCHEMA"
