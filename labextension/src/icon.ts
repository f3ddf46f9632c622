import { LabIcon } from '@jupyterlab/ui-components';

// Three request rows of a batch timeline.
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="2" y="4" width="14" height="4" rx="1"/>
    <rect x="6" y="10" width="16" height="4" rx="1"/>
    <rect x="4" y="16" width="10" height="4" rx="1"/>
  </g>
</svg>`;

export const inferIcon = new LabIcon({ name: 'jupyter-infer:timeline', svgstr });
