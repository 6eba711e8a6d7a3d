package server

import (
	"embed"
	"io/fs"
	"net/http"
)

// web holds the page served at "/" and its assets, built into the binary.
//
//go:embed web
var web embed.FS

// webHandler serves the files under web/ at the root: index.html at "/".
func webHandler() http.Handler {
	sub, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		// The page carries no data, but it must not be framed by another
		// site (clickjacking of the cancel button) nor cached across
		// versions.
		w.Header().Set("X-Frame-Options", "DENY")
		// The page's script and styles are its own files: nothing inline,
		// nothing from elsewhere, so injected markup could not run.
		w.Header().Set("Content-Security-Policy",
			"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
