package kubernetes

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpustore/gpustore/pkg/app"
)

const zonesComponent = "components/zones"

// TestZones: the scaled overlay with the zones component, and the chart
// with config.ring.zone_awareness_enabled, run every ring process zone-aware
// (by gpustore's own loader, which refuses a receiver without a zone), give
// each receiver its node's zone through the downward API, and spread the
// receivers evenly over the zones. Without them nothing is zone-aware.
func TestZones(t *testing.T) {
	members := []string{"StatefulSet/gpustore-receiver", "Deployment/gpustore-distributor", "Deployment/gpustore-querier", "Deployment/gpustore-ruler"}
	targets := overlayCases[1].targets
	check := func(t *testing.T, o *objects, want bool) {
		t.Helper()
		pods := o.pods()
		for name, target := range targets {
			pod := pods[name]
			if pod == nil {
				t.Fatalf("no workload %s", name)
			}
			cfg := checkGpustorePod(t, o, name, pod, target)
			// The compactor is in no ring: the chart's config file
			// reaches it too, unread.
			if slices.Contains(members, name) && cfg.Ring.ZoneAwarenessEnabled != want {
				t.Errorf("%s: ring.zone_awareness_enabled %v, want %v", name, cfg.Ring.ZoneAwarenessEnabled, want)
			}
			if name != "StatefulSet/gpustore-receiver" {
				if cfg.Ring.InstanceZone != "" {
					t.Errorf("%s: a zone (%s) on a process that holds no data", name, cfg.Ring.InstanceZone)
				}
				continue
			}
			checkReceiverZone(t, name, pod, cfg, want)
		}
	}
	t.Run("overlay", func(t *testing.T) {
		check(t, render(t, "overlays/scaled"), false)
		check(t, renderWith(t, "overlays/scaled", "components: [$HERE/"+zonesComponent+"]\n"), true)
	})
	t.Run("chart", func(t *testing.T) {
		values := func(zones bool) map[string]any {
			return map[string]any{"mode": "scaled", "config": map[string]any{"ring": map[string]any{"zone_awareness_enabled": zones}}}
		}
		check(t, renderChart(t, "gpustore", "gpustore", values(false)), false)
		check(t, renderChart(t, "gpustore", "gpustore", values(true)), true)
	})
}

func checkReceiverZone(t *testing.T, name string, pod *corev1.PodTemplateSpec, cfg app.Config, want bool) {
	t.Helper()
	wantZone := ""
	if want {
		wantZone = podEnvSamples["metadata.labels['topology.kubernetes.io/zone']"]
	}
	if cfg.Ring.InstanceZone != wantZone {
		t.Errorf("%s: ring.instance_zone %q, want %q (the node's zone label through the downward API)", name, cfg.Ring.InstanceZone, wantZone)
	}
	spread := slices.IndexFunc(pod.Spec.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
		return c.TopologyKey == "topology.kubernetes.io/zone"
	})
	if (spread >= 0) != want {
		t.Errorf("%s: spread over zones %v, want %v", name, spread >= 0, want)
		return
	}
	if !want {
		return
	}
	c := pod.Spec.TopologySpreadConstraints[spread]
	if c.MaxSkew != 1 || c.WhenUnsatisfiable != corev1.DoNotSchedule || c.LabelSelector == nil ||
		c.LabelSelector.MatchLabels["app.kubernetes.io/component"] != "receiver" {
		t.Errorf("%s: zone spread %+v, want the receivers evenly over the zones (maxSkew 1, DoNotSchedule)", name, c)
	}
}
