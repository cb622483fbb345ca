package kubernetes

import (
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// One `images:` entry named gpustore retargets every container of every
// workload: a user's overlay (or `kustomize edit set image
// gpustore=<registry>/gpustore:<tag>`) points the whole deployment at the
// image `make docker REGISTRY=... PUSH=1` pushed.
func TestOneImageEditRetargetsEveryWorkload(t *testing.T) {
	const image = "registry.example.com/team/gpustore:v1.2.3"
	for _, tc := range overlayCases {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			for name, images := range containerImages(render(t, tc.overlay)) {
				for _, img := range images {
					if img != "gpustore:dev" {
						t.Errorf("%s: image %s, want gpustore:dev (what make docker builds) from the base's images entry", name, img)
					}
				}
			}
			o := renderWith(t, tc.overlay, "images:\n  - name: gpustore\n    newName: registry.example.com/team/gpustore\n    newTag: v1.2.3\n")
			if len(o.pods()) == 0 {
				t.Fatal("no workload")
			}
			for name, images := range containerImages(o) {
				for _, img := range images {
					if img != image {
						t.Errorf("%s: image %s after the images edit, want %s", name, img, image)
					}
				}
			}
		})
	}
}

// containerImages lists every container's image by workload.
func containerImages(o *objects) map[string][]string {
	m := map[string][]string{}
	for name, pod := range o.pods() {
		for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
			m[name] = append(m[name], c.Image)
		}
		for _, c := range pod.Spec.EphemeralContainers {
			m[name] = append(m[name], corev1.Container(c.EphemeralContainerCommon).Image)
		}
	}
	return m
}
