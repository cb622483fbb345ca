// Package render draws a Grafana dashboard's layout as a picture: its grid
// positions, rows, panel titles, types, units and series names, with a
// schematic drawing per panel type (lines for a time series, an arc for a
// gauge, cells for a heat map). No Grafana server can run where gpustore is
// built and tested, so this is how the README shows what each generated
// dashboard looks like before anyone installs it. The drawings are not data.
package render

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"math"
	"strings"
	"unicode/utf8"

	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
)

// Grafana's grid: 24 columns; a grid unit of height is 30 px at Grafana's
// scale, drawn smaller here so a whole dashboard fits one picture.
const (
	width   = 1280
	margin  = 16
	gap     = 6
	unitH   = 22
	columns = 24
	header  = 64
)

// Colours of Grafana's dark theme and its classic series palette.
var (
	background = color.RGBA{0x11, 0x12, 0x17, 0xff}
	panelFill  = color.RGBA{0x18, 0x1b, 0x1f, 0xff}
	border     = color.RGBA{0x2c, 0x30, 0x36, 0xff}
	text       = color.RGBA{0xcc, 0xcc, 0xdc, 0xff}
	faint      = color.RGBA{0x8e, 0x8e, 0x9e, 0xff}
	grid       = color.RGBA{0x24, 0x27, 0x2c, 0xff}
	palette    = []color.RGBA{
		{0x73, 0xbf, 0x69, 0xff}, {0xfa, 0xde, 0x2a, 0xff}, {0x57, 0x94, 0xf2, 0xff},
		{0xff, 0x98, 0x30, 0xff}, {0xf2, 0x49, 0x5c, 0xff}, {0xb8, 0x77, 0xd9, 0xff},
	}
)

// dashboardJSON is the part of a dashboard's JSON that is drawn.
type dashboardJSON struct {
	Title string `json:"title"`
	Time  struct {
		From string `json:"from"`
	} `json:"time"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Label string `json:"label"`
			Multi bool   `json:"multi"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panelJSON `json:"panels"`
}

type panelJSON struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// canvas is the picture being drawn with its fonts.
type canvas struct {
	img                *image.RGBA
	title, bold, small font.Face
}

// Image draws the dashboard whose JSON is b.
func Image(b []byte) (*image.RGBA, error) {
	var d dashboardJSON
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard JSON: %w", err)
	}
	bottom := 0
	for _, p := range d.Panels {
		bottom = max(bottom, p.GridPos.Y+p.GridPos.H)
	}
	c, err := newCanvas(width, header+bottom*unitH+margin)
	if err != nil {
		return nil, err
	}
	c.fill(c.img.Bounds(), background)
	c.header(d)
	for _, p := range d.Panels {
		c.panel(p)
	}
	return c.img, nil
}

func newCanvas(w, h int) (*canvas, error) {
	face := func(ttf []byte, size float64) (font.Face, error) {
		f, err := opentype.Parse(ttf)
		if err != nil {
			return nil, err
		}
		return opentype.NewFace(f, &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
	}
	c := &canvas{img: image.NewRGBA(image.Rect(0, 0, w, h))}
	var err error
	if c.title, err = face(gobold.TTF, 20); err != nil {
		return nil, err
	}
	if c.bold, err = face(gobold.TTF, 13); err != nil {
		return nil, err
	}
	if c.small, err = face(goregular.TTF, 11); err != nil {
		return nil, err
	}
	return c, nil
}

// header draws the title, the variables as Grafana's pickers show them and
// the default time range.
func (c *canvas) header(d dashboardJSON) {
	c.text(c.title, margin, 30, d.Title, text, width-2*margin)
	x := margin
	for _, v := range d.Templating.List {
		label := v.Label
		if label == "" {
			label = v.Name
		}
		value := "first value"
		switch {
		case v.Name == "datasource":
			value = "gpustore"
		case v.Multi:
			value = "All"
		}
		s := label + ": " + value
		w := font.MeasureString(c.small, s).Ceil() + 16
		c.box(image.Rect(x, 40, x+w, 58), panelFill, border)
		c.text(c.small, x+8, 53, s, text, w)
		x += w + gap
	}
	rng := "Last " + strings.TrimPrefix(d.Time.From, "now-")
	w := font.MeasureString(c.small, rng).Ceil() + 16
	c.box(image.Rect(width-margin-w, 40, width-margin, 58), panelFill, border)
	c.text(c.small, width-margin-w+8, 53, rng, text, w)
}

// cell is the rectangle of a grid position.
func cell(x, y, w, h int) image.Rectangle {
	colW := float64(width-2*margin) / columns
	x0 := margin + int(math.Round(float64(x)*colW))
	x1 := margin + int(math.Round(float64(x+w)*colW)) - gap
	y0 := header + y*unitH
	return image.Rect(x0, y0, x1, y0+h*unitH-gap)
}

func (c *canvas) panel(p panelJSON) {
	r := cell(p.GridPos.X, p.GridPos.Y, p.GridPos.W, p.GridPos.H)
	if p.Type == "row" {
		for i := 0; i < 5; i++ { // Grafana's expanded-row caret
			c.fill(image.Rect(r.Min.X+2+i, r.Min.Y+7+i, r.Min.X+11-i, r.Min.Y+8+i), text)
		}
		c.text(c.bold, r.Min.X+16, r.Min.Y+15, p.Title, text, r.Dx()-16)
		c.fill(image.Rect(r.Min.X, r.Max.Y+gap/2-1, r.Max.X, r.Max.Y+gap/2), border)
		return
	}
	c.box(r, panelFill, border)
	unit := unitNames[p.FieldConfig.Defaults.Unit]
	uw := font.MeasureString(c.small, unit).Ceil()
	c.text(c.small, r.Max.X-8-uw, r.Min.Y+16, unit, faint, uw+1)
	c.text(c.bold, r.Min.X+8, r.Min.Y+16, p.Title, text, r.Dx()-uw-24)
	body := image.Rect(r.Min.X+8, r.Min.Y+24, r.Max.X-8, r.Max.Y-6)
	var legends []string
	for _, t := range p.Targets {
		legends = append(legends, legend(t.LegendFormat))
	}
	switch p.Type {
	case "timeseries":
		c.timeSeries(body, legends)
	case "stat":
		c.stat(body)
	case "gauge":
		c.gauge(body)
	case "bargauge":
		c.barGauge(body)
	case "heatmap":
		c.heatmap(body)
	default:
		c.text(c.small, body.Min.X, body.Min.Y+12, p.Type, faint, body.Dx())
	}
}

// unitNames are Grafana's unit ids as its axes show them; "none" shows
// nothing.
var unitNames = map[string]string{
	"percent": "%", "percentunit": "%", "celsius": "°C", "watt": "W", "kwatt": "kW", "hertz": "Hz",
	"decmbytes": "MB", "bytes": "bytes", "Bps": "B/s", "Gbits": "Gb/s", "s": "seconds", "cps": "per second",
	"reqps": "req/s",
}

// legend shows a legend template's label references as {label}.
func legend(format string) string {
	if format == "" {
		return "value"
	}
	return strings.NewReplacer("{{", "{", "}}", "}").Replace(format)
}

// timeSeries draws axes, one schematic line per query and the legend.
func (c *canvas) timeSeries(r image.Rectangle, legends []string) {
	plot := image.Rect(r.Min.X+4, r.Min.Y+2, r.Max.X-4, r.Max.Y-16)
	for i := 0; i <= 3; i++ {
		y := plot.Min.Y + i*plot.Dy()/3
		c.fill(image.Rect(plot.Min.X, y, plot.Max.X, y+1), grid)
	}
	x := r.Min.X + 4
	for i, l := range legends {
		col := palette[i%len(palette)]
		c.line(plot, i, col)
		if strings.Contains(l, "{") { // a series per label value: draw a few
			c.line(plot, i+len(legends), blend(col, panelFill, 0.35))
			c.line(plot, i+2*len(legends), blend(col, panelFill, 0.6))
		}
		w := font.MeasureString(c.small, l).Ceil()
		if x+14+w > r.Max.X {
			break
		}
		c.fill(image.Rect(x, r.Max.Y-9, x+10, r.Max.Y-6), col)
		c.text(c.small, x+14, r.Max.Y-3, l, text, w+1)
		x += w + 26
	}
}

// line draws a smooth schematic series in plot, shaped by its index.
func (c *canvas) line(plot image.Rectangle, i int, col color.RGBA) {
	phase, level := float64(i)*1.7, 0.55-0.12*float64(i%4)
	prev := image.Point{-1, -1}
	for x := plot.Min.X; x < plot.Max.X; x++ {
		t := float64(x-plot.Min.X) / float64(plot.Dx())
		v := level + 0.16*math.Sin(t*7+phase) + 0.06*math.Sin(t*23+2*phase)
		y := plot.Max.Y - int(v*float64(plot.Dy()))
		y = min(max(y, plot.Min.Y), plot.Max.Y-1)
		if prev.X >= 0 {
			for yy := min(prev.Y, y); yy <= max(prev.Y, y); yy++ {
				c.img.Set(x, yy, col)
			}
		}
		prev = image.Point{x, y}
	}
}

// stat draws a value placeholder above a sparkline.
func (c *canvas) stat(r image.Rectangle) {
	h := min(r.Dy()/3, 18)
	c.fill(image.Rect(r.Min.X+4, r.Min.Y+8, r.Min.X+4+r.Dx()/3, r.Min.Y+8+h), palette[0])
	c.line(image.Rect(r.Min.X, r.Max.Y-r.Dy()/3, r.Max.X, r.Max.Y), 0, color.RGBA{0x3d, 0x71, 0x3a, 0xff})
}

// gauge draws a half circle filled to 60%, with a thresholds band (green,
// red past 75%) around it.
func (c *canvas) gauge(r image.Rectangle) {
	cx, cy := float64(r.Min.X+r.Dx()/2), float64(r.Max.Y-4)
	outer := math.Min(float64(r.Dx())/2-4, float64(r.Dy())-8)
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			dx, dy := float64(x)-cx, cy-float64(y)
			d := math.Hypot(dx, dy)
			if dy < 0 || d > outer || d < outer*0.7 {
				continue
			}
			a := 1 - math.Atan2(dy, dx)/math.Pi // 0 left, 1 right
			col := grid
			if a <= 0.6 {
				col = palette[0]
			}
			if d > outer*0.95 { // the threshold band
				col = palette[0]
				if a > 0.75 {
					col = palette[4]
				}
			}
			c.img.Set(x, y, col)
		}
	}
}

// barGauge draws horizontal bars of decreasing length, green to red.
func (c *canvas) barGauge(r image.Rectangle) {
	n := 4
	h := (r.Dy() - (n-1)*4) / n
	for i := 0; i < n; i++ {
		y := r.Min.Y + i*(h+4)
		c.fill(image.Rect(r.Min.X, y, r.Max.X, y+h), grid)
		end := r.Min.X + int(float64(r.Dx())*(0.85-0.17*float64(i)))
		for x := r.Min.X; x < end; x++ {
			c.fill(image.Rect(x, y, x+1, y+h), blend(palette[0], palette[4], float64(x-r.Min.X)/float64(r.Dx())))
		}
	}
}

// heatmap draws 8 rows of cells, blue (cold) to red (hot).
func (c *canvas) heatmap(r image.Rectangle) {
	rows, cols := 8, 48
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			v := 0.5 + 0.3*math.Sin(float64(j)/5+float64(i)) + 0.2*math.Sin(float64(i*j)/7)
			cellR := image.Rect(r.Min.X+j*r.Dx()/cols, r.Min.Y+i*r.Dy()/rows, r.Min.X+(j+1)*r.Dx()/cols-1, r.Min.Y+(i+1)*r.Dy()/rows-1)
			c.fill(cellR, blend(palette[2], palette[4], math.Min(1, math.Max(0, v))))
		}
	}
}

func blend(a, b color.RGBA, t float64) color.RGBA {
	mix := func(x, y uint8) uint8 { return uint8(float64(x) + (float64(y)-float64(x))*t) }
	return color.RGBA{mix(a.R, b.R), mix(a.G, b.G), mix(a.B, b.B), 0xff}
}

func (c *canvas) fill(r image.Rectangle, col color.Color) {
	draw.Draw(c.img, r, image.NewUniform(col), image.Point{}, draw.Src)
}

// box fills r and draws its one-pixel border.
func (c *canvas) box(r image.Rectangle, fill, line color.Color) {
	c.fill(r, line)
	c.fill(r.Inset(1), fill)
}

// text draws s with its baseline at y, cut with an ellipsis to maxW pixels.
func (c *canvas) text(face font.Face, x, y int, s string, col color.Color, maxW int) {
	if font.MeasureString(face, s).Ceil() > maxW {
		for len(s) > 0 && font.MeasureString(face, s+"…").Ceil() > maxW {
			_, size := utf8.DecodeLastRuneInString(s)
			s = s[:len(s)-size]
		}
		s += "…"
	}
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
