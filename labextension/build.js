// The extension's build with Jupyter's own builder (@jupyterlab/builder), against the JupyterLab core
// metadata pinned in package-lock.json (@jupyterlab/core-meta). This is what `jupyter labextension
// build` runs, without Python: a wheel's isolated build then needs no jupyterlab package in its
// build environment (about 15 s saved on every pip install and wheel build).
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const modules = path.join(__dirname, 'node_modules');
// The builder reads the core's package.json from --core-path; core-meta ships it as core.package.json.
const core = fs.mkdtempSync(path.join(os.tmpdir(), 'ivralo-labext-core-'));
try {
  fs.copyFileSync(
    path.join(modules, '@jupyterlab', 'core-meta', 'core.package.json'),
    path.join(core, 'package.json')
  );
  const builder = path.join(modules, '@jupyterlab', 'builder', 'lib', 'build-labextension.js');
  execFileSync(process.execPath, [builder, '--core-path', core, __dirname], {
    cwd: __dirname,
    stdio: 'inherit'
  });
} finally {
  fs.rmSync(core, { recursive: true, force: true });
}
