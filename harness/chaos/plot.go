package chaos

import (
	"fmt"
	"image/color"
	"os"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	colWait   = color.RGBA{R: 120, G: 144, B: 200, A: 255} // request sent → first token (prefill, pull)
	colDecode = color.RGBA{R: 60, G: 160, B: 90, A: 255}   // decoding
	colWhole  = color.RGBA{R: 160, G: 200, B: 160, A: 255} // a request that was not streamed
	colGap    = color.RGBA{R: 220, G: 40, B: 40, A: 255}   // a pause in the stream: a resume
	colFailed = color.RGBA{R: 240, G: 150, B: 30, A: 255}  // ended with an error
	colLost   = color.RGBA{R: 0, G: 0, B: 0, A: 255}
	colFault  = color.RGBA{R: 150, G: 40, B: 160, A: 255}
)

func secs(d time.Duration) float64 { return d.Seconds() }

func segment(x0, x1, y float64, c color.Color, width vg.Length) (*plotter.Line, error) {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return nil, err
	}
	l.Color, l.Width = c, width
	return l, nil
}

// WritePlot draws the run as a PNG: above, a timeline with one bar per
// request (waiting for its first token, decoding, pauses where it resumed,
// failures) and the faults as vertical marks; below, each request's
// latency at the time it ended.
func (r *Report) WritePlot(path string) error {
	tl := plot.New()
	tl.Title.Text = fmt.Sprintf("%s: %d requests, %d faults — %d completed, %d failed, %d lost, %d resumed", r.Scenario, r.Requests, len(r.Faults), r.Completed, r.Failed, r.Lost, r.Resumed)
	tl.X.Label.Text = "time since the load started (s)"
	tl.Y.Label.Text = "request"
	width := vg.Points(max(1, min(6, 600/float64(max(1, len(r.Records))))))
	legend := map[string]*plotter.Line{}
	add := func(name string, l *plotter.Line) {
		tl.Add(l)
		if _, ok := legend[name]; !ok {
			legend[name] = l
		}
	}
	for _, rec := range r.Records {
		y := float64(rec.N)
		end := rec.End
		switch {
		case rec.Lost:
			l, err := segment(secs(rec.Start), secs(end), y, colLost, width)
			if err != nil {
				return err
			}
			add("lost", l)
			continue
		case !rec.Completed():
			l, err := segment(secs(rec.Start), secs(end), y, colFailed, width)
			if err != nil {
				return err
			}
			add("failed (clear error)", l)
			continue
		}
		if !rec.Stream {
			l, err := segment(secs(rec.Start), secs(end), y, colWhole, width)
			if err != nil {
				return err
			}
			add("not streamed (whole answer)", l)
			continue
		}
		first := rec.FirstToken
		if first == 0 {
			first = end
		}
		l, err := segment(secs(rec.Start), secs(first), y, colWait, width)
		if err != nil {
			return err
		}
		add("prefill + pull", l)
		if l, err = segment(secs(first), secs(end), y, colDecode, width); err != nil {
			return err
		}
		add("decode", l)
		for _, g := range rec.Gaps {
			if l, err = segment(secs(g.At), secs(g.At+g.Len), y, colGap, width); err != nil {
				return err
			}
			add("resume gap", l)
		}
	}
	top := float64(len(r.Records))
	var marks plotter.XYLabels
	for i, f := range r.Faults {
		l, err := plotter.NewLine(plotter.XYs{{X: secs(f.At), Y: -1}, {X: secs(f.At), Y: top}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes = colFault, []vg.Length{vg.Points(4), vg.Points(3)}
		add("fault", l)
		what := string(f.Action) + " " + f.Resolved
		if f.Skipped != "" {
			what += " (skipped)"
		}
		marks.XYs = append(marks.XYs, plotter.XY{X: secs(f.At), Y: top - float64(i%4)*top/20})
		marks.Labels = append(marks.Labels, what)
	}
	// Labels only while they can be read; a soak's faults are marks.
	if len(marks.Labels) > 0 && len(marks.Labels) <= 16 {
		labels, err := plotter.NewLabels(marks)
		if err != nil {
			return err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].Color = colFault
		}
		tl.Add(labels)
	}
	for _, name := range []string{"prefill + pull", "decode", "not streamed (whole answer)", "resume gap", "failed (clear error)", "lost", "fault"} {
		if l, ok := legend[name]; ok {
			tl.Legend.Add(name, l)
		}
	}
	tl.Legend.Top = true
	tl.Y.Min, tl.Y.Max = -1, top+top/10+1

	lat := plot.New()
	lat.Title.Text = "end-to-end latency of each request, at the time it ended"
	lat.X.Label.Text = "time since the load started (s)"
	lat.Y.Label.Text = "latency (s)"
	var ok, bad plotter.XYs
	for _, rec := range r.Records {
		p := plotter.XY{X: secs(rec.End), Y: secs(rec.End - rec.Start)}
		if rec.Completed() {
			ok = append(ok, p)
		} else {
			bad = append(bad, p)
		}
	}
	for _, set := range []struct {
		pts   plotter.XYs
		name  string
		color color.Color
		shape draw.GlyphDrawer
	}{{ok, "completed", colDecode, draw.CircleGlyph{}}, {bad, "failed or lost", colGap, draw.CrossGlyph{}}} {
		if len(set.pts) == 0 {
			continue
		}
		s, err := plotter.NewScatter(set.pts)
		if err != nil {
			return err
		}
		s.GlyphStyle.Color, s.GlyphStyle.Shape, s.GlyphStyle.Radius = set.color, set.shape, vg.Points(2)
		lat.Add(s)
		lat.Legend.Add(set.name, s)
	}
	for _, f := range r.Faults {
		l, err := plotter.NewLine(plotter.XYs{{X: secs(f.At), Y: 0}, {X: secs(f.At), Y: maxLatency(r.Records)}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes = colFault, []vg.Length{vg.Points(4), vg.Points(3)}
		lat.Add(l)
	}
	lat.Legend.Top = true
	lat.X.Min, lat.X.Max = tl.X.Min, tl.X.Max

	img := vgimg.New(vg.Points(1400), vg.Points(1000))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(16), PadY: vg.Points(20)}
	canvases := plot.Align([][]*plot.Plot{{tl}, {lat}}, tiles, dc)
	tl.Draw(canvases[0][0])
	lat.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chaos: write plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("chaos: write plot: %w", err)
	}
	return f.Close()
}

func maxLatency(rs []*Record) float64 {
	m := 1.0
	for _, r := range rs {
		m = max(m, secs(r.End-r.Start))
	}
	return m
}
