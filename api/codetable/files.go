package codetable

// File is one file generated from the table.
type File struct {
	Path string // from the repository root
	Data []byte
}

// Files renders every file generated from t, docs/api.md aside (see Doc).
func Files(t Table) ([]File, error) {
	files := []File{{Path: "engine/vllm-connector/connex_vllm/codes.py", Data: Python(t)}}
	for _, g := range []struct {
		path   string
		render func(Table) ([]byte, error)
	}{
		{"api/codes_gen.go", APIGo},
		{"router/codes_gen.go", RouterGo},
		{"engine/shim/reasons_gen.go", ShimGo},
	} {
		data, err := g.render(t)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Path: g.path, Data: data})
	}
	return files, nil
}

// Doc is readme (docs/api.md) with both generated tables rewritten from t.
func Doc(readme string, t Table) (string, error) {
	out, err := Splice(readme, Begin, End, Markdown(t))
	if err != nil {
		return "", err
	}
	return Splice(out, BeginHTTP, EndHTTP, MarkdownHTTP(t))
}
