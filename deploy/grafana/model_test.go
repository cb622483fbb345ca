package grafana

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// board is the part of a committed dashboard JSON the tests read.
type board struct {
	UID   string `json:"uid"`
	Title string `json:"title"`
	Time  struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Type       string `json:"type"`
	Name       string `json:"name"`
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue"`
	Definition string `json:"definition"`
	Query      any    `json:"query"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X int `json:"x"`
		Y int `json:"y"`
		W int `json:"w"`
		H int `json:"h"`
	} `json:"gridPos"`
	Description string `json:"description"`
	Datasource  struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	FieldConfig struct {
		Defaults struct {
			Unit string   `json:"unit"`
			Min  *float64 `json:"min"`
			Max  *float64 `json:"max"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID  string `json:"refId"`
		Expr   string `json:"expr"`
		Legend string `json:"legendFormat"`
	} `json:"targets"`
}

// committed reads every dashboard in dashboards/.
func committed(t *testing.T) map[string]board {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in dashboards/ (%v)", err)
	}
	out := map[string]board{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d board
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = d
	}
	return out
}

var varRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// usedVars returns the dashboard variables an expression refers to,
// Grafana's built-ins ($__rate_interval, ...) left out.
func usedVars(expr string) []string {
	var out []string
	for _, m := range varRef.FindAllStringSubmatch(expr, -1) {
		if !strings.HasPrefix(m[1], "__") && !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}
