package render

import (
	"image"
	"image/color"
	"strings"
	"testing"
)

// A small dashboard: a row, a time series and a stat side by side, and a
// heat map below them with a title far too long for it.
const small = `{
  "title": "t", "time": {"from": "now-6h"},
  "templating": {"list": [{"name": "datasource"}, {"name": "gpu", "multi": true}]},
  "panels": [
    {"type": "row", "title": "Row", "gridPos": {"x": 0, "y": 0, "w": 24, "h": 1}},
    {"type": "timeseries", "title": "Left", "gridPos": {"x": 0, "y": 1, "w": 12, "h": 8},
     "fieldConfig": {"defaults": {"unit": "percent"}}, "targets": [{"legendFormat": "{{gpu}}"}]},
    {"type": "stat", "title": "Right", "gridPos": {"x": 12, "y": 1, "w": 12, "h": 8}},
    {"type": "heatmap", "title": "` + "A title far longer than the panel is wide, which must be cut short before the edge" + `",
     "gridPos": {"x": 0, "y": 9, "w": 6, "h": 6}}
  ]
}`

// The picture follows the grid: each panel's box is where its grid position
// puts it (border on its edge, panel colour inside, background between
// panels), the picture ends below the lowest panel, and text stays inside
// its panel.
func TestImageFollowsTheGrid(t *testing.T) {
	img, err := Image([]byte(small))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := img.Bounds().Dy(), header+15*unitH+margin; got != want {
		t.Errorf("height %d, want %d (header + 15 grid units + margin)", got, want)
	}
	left, right, below := cell(0, 1, 12, 8), cell(12, 1, 12, 8), cell(0, 9, 6, 6)
	// Grid unit 12 of 24 is the middle of the drawing width, grid row 1
	// one unit below the header; a panel 8 units high ends a gap short.
	if right.Min.X != margin+(width-2*margin)/2 || left.Min.Y != header+unitH || left.Dy() != 8*unitH-gap {
		t.Fatalf("cells %v %v: not where the grid puts them", left, right)
	}
	for name, r := range map[string]image.Rectangle{"left": left, "right": right, "heat map": below} {
		if c := img.RGBAAt(r.Min.X, r.Min.Y); c != border {
			t.Errorf("%s: top-left corner %v, want the border %v", name, c, border)
		}
		if c := img.RGBAAt(r.Max.X-1, r.Max.Y-1); c != border {
			t.Errorf("%s: bottom-right corner %v, want the border %v", name, c, border)
		}
		if c := img.RGBAAt(r.Max.X-3, r.Min.Y+3); c != panelFill {
			t.Errorf("%s: inside %v, want the panel colour %v", name, c, panelFill)
		}
	}
	if c := img.RGBAAt(left.Max.X+gap/2, left.Min.Y+20); c != background {
		t.Errorf("between two panels %v, want the background %v", c, background)
	}
	if !hasColour(img, image.Rect(left.Min.X, left.Min.Y, left.Min.X+60, left.Min.Y+20), text) {
		t.Error("no title text in the left panel's title bar")
	}
	// The long title is cut inside its panel: nothing is drawn right of it
	// in the title bar.
	beyond := image.Rect(below.Max.X, below.Min.Y, below.Max.X+40, below.Min.Y+20)
	for y := beyond.Min.Y; y < beyond.Max.Y; y++ {
		for x := beyond.Min.X; x < beyond.Max.X; x++ {
			if c := img.RGBAAt(x, y); c != background {
				t.Fatalf("pixel %v right of the heat map's title bar is %v, want the background", image.Pt(x, y), c)
			}
		}
	}
	// The time series draws its series in the palette's first colour.
	if !hasColour(img, left.Inset(10), palette[0]) {
		t.Error("no series line in the time series panel")
	}
}

func hasColour(img *image.RGBA, r image.Rectangle, want color.RGBA) bool {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c := img.RGBAAt(x, y)
			// Anti-aliased text: any pixel close to the colour.
			if diff(c.R, want.R)+diff(c.G, want.G)+diff(c.B, want.B) < 24 {
				return true
			}
		}
	}
	return false
}

func diff(a, b uint8) int {
	if a > b {
		return int(a - b)
	}
	return int(b - a)
}

func TestImageRejectsBadJSON(t *testing.T) {
	if _, err := Image([]byte(`{"panels": [`)); err == nil || !strings.Contains(err.Error(), "dashboard JSON") {
		t.Errorf("bad JSON: %v", err)
	}
}
