// Bundle the timeline renderer for the notebook's anywidget: one ESM file with no imports
// (anywidget loads it as is, no CDN), plus the shared stylesheet, into the Python package.
import { build } from 'esbuild';
import { copyFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const out = join(here, '..', 'jupyter_infer', 'kernel', 'widgets', 'static');

await build({
  entryPoints: [join(here, 'src', 'timeline', 'widget.ts')],
  outfile: join(out, 'timeline.js'),
  bundle: true,
  format: 'esm',
  target: 'es2020',
  legalComments: 'none',
  banner: {
    js: '// Built from labextension/src/timeline/ by `npm run build` (labextension/README.md); do not edit.'
  },
  logLevel: 'warning'
});
copyFileSync(join(here, 'style', 'timeline.css'), join(out, 'timeline.css'));
