// The interactive API documentation at /docs: Swagger UI, served from the package.
// Kept in a file of its own (no inline script) so that the page's policy allows only
// scripts from this origin.
const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.url,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // no badge fetched from swagger.io
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
