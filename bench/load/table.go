package load

import (
	"strings"
	"unicode/utf8"
)

// Table is a text table rendered as Markdown with aligned columns, readable
// on a terminal and pasteable into RESULTS.md.
type Table struct {
	Header []string
	Rows   [][]string
}

// AddRow appends a row; missing cells render empty, extra ones are dropped.
func (t *Table) AddRow(cells ...string) { t.Rows = append(t.Rows, cells) }

// String renders the table. The first column is left-aligned, the others
// right-aligned (they hold numbers).
func (t *Table) String() string {
	widths := make([]int, len(t.Header))
	for i, h := range t.Header {
		widths[i] = max(utf8.RuneCountInString(h), 3)
	}
	for _, r := range t.Rows {
		for i := 0; i < len(widths) && i < len(r); i++ {
			widths[i] = max(widths[i], utf8.RuneCountInString(r[i]))
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i, w := range widths {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			pad := strings.Repeat(" ", w-utf8.RuneCountInString(c))
			b.WriteString(" ")
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	line(t.Header)
	b.WriteString("|")
	for i, w := range widths {
		if i == 0 {
			b.WriteString(" " + strings.Repeat("-", w) + " |")
		} else {
			b.WriteString(" " + strings.Repeat("-", w-1) + ": |")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		line(r)
	}
	return b.String()
}
