package console

import (
	"cmp"
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is sent with every console page: nothing from
// elsewhere, no inline script or style, no framing.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"

// headers sets the console's security headers.
func headers(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
}

// Register adds the console's routes to mux: the pages under /console/
// and the session under /console/session. They need no token (the pages
// hold none; the session routes take one).
func Register(mux *http.ServeMux, g *Guard) {
	mux.HandleFunc("GET /console/", func(w http.ResponseWriter, r *http.Request) {
		headers(w.Header())
		name := cmp.Or(strings.TrimPrefix(r.URL.Path, "/console/"), "index.html")
		if !fs.ValidPath(name) || strings.HasSuffix(name, "/") {
			http.NotFound(w, r)
			return
		}
		http.ServeFileFS(w, r, assets, "assets/"+name)
	})
	mux.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("POST /console/session", func(w http.ResponseWriter, r *http.Request) {
		headers(w.Header())
		g.signIn(w, r)
	})
	mux.HandleFunc("GET /console/session", func(w http.ResponseWriter, r *http.Request) {
		headers(w.Header())
		g.session(w, r)
	})
	mux.HandleFunc("DELETE /console/session", func(w http.ResponseWriter, r *http.Request) {
		headers(w.Header())
		g.signOut(w, r)
	})
}
