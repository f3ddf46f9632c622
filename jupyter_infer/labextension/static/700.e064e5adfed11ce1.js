"use strict";(self.rspackChunkjupyter_infer=self.rspackChunkjupyter_infer||[]).push([[700],{646(e,i,r){var o=r(601),a=r.n(o),t=r(314),n=r.n(t),l=r(813),p=n()(a());p.i(l.A),p.push([e.id,`/* The Inference side panel and status-bar item: JupyterLab theme variables only. */

.ji-panel {
  display: flex;
  flex-direction: column;
  gap: 10px;
  min-width: 380px; /* a model's name, its weights and its path fit (300 px cut them) */
  padding: 8px 10px 12px;
  overflow-y: auto;
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
}

.ji-panel .ji-header {
  display: flex;
  align-items: center;
  justify-content: space-between;
  gap: 8px;
}

.ji-panel .ji-heading {
  margin: 0;
  font-size: var(--jp-ui-font-size2);
  font-weight: 600;
  letter-spacing: 0.02em;
}

.ji-panel .ji-subheading {
  margin: 0;
  font-size: var(--jp-ui-font-size1);
  font-weight: 600;
  color: var(--jp-ui-font-color1);
}

.ji-panel .ji-state {
  padding: 1px 8px;
  border-radius: 10px;
  border: 1px solid var(--jp-border-color1);
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color2);
  white-space: nowrap;
}

.ji-panel .ji-state[data-state='ready'] {
  border-color: var(--jp-success-color1);
  color: var(--jp-success-color1);
}

.ji-panel .ji-state[data-state='loading'] {
  border-color: var(--jp-warn-color1);
  color: var(--jp-warn-color0);
}

.ji-panel .ji-state[data-state='failed'],
.ji-panel .ji-state[data-state='offline'] {
  border-color: var(--jp-error-color1);
  color: var(--jp-error-color0);
}

.ji-panel .ji-notice {
  padding: 4px 8px;
  border-left: 3px solid var(--jp-info-color1);
  background: var(--jp-layout-color2);
  color: var(--jp-ui-font-color1);
  overflow-wrap: anywhere;
}

.ji-panel .ji-notice[data-kind='warn'] {
  border-left-color: var(--jp-warn-color1);
}

.ji-panel .ji-notice[data-kind='error'] {
  border-left-color: var(--jp-error-color1);
}

.ji-panel .ji-section {
  display: flex;
  flex-direction: column;
  gap: 4px;
}

.ji-panel .ji-status {
  display: grid;
  grid-template-columns: max-content minmax(0, 1fr);
  gap: 2px 10px;
}

.ji-panel .ji-field {
  display: contents;
}

.ji-panel .ji-field-label {
  color: var(--jp-ui-font-color2);
}

.ji-panel .ji-field-value {
  color: var(--jp-ui-font-color0);
  min-width: 0;
  overflow-wrap: anywhere; /* a long path or reason wraps; nothing is cut */
}

.ji-panel .ji-figures {
  display: grid;
  grid-template-columns: repeat(auto-fill, minmax(120px, 1fr));
  gap: 6px;
}

.ji-panel .ji-figure {
  padding: 4px 6px;
  border: 1px solid var(--jp-border-color2);
  border-radius: 3px;
  background: var(--jp-layout-color0);
  min-width: 0;
}

.ji-panel .ji-figure-value {
  font-size: var(--jp-ui-font-size2);
  font-weight: 600;
  color: var(--jp-ui-font-color0);
  white-space: nowrap;
  overflow: hidden;
  text-overflow: ellipsis;
  font-variant-numeric: tabular-nums;
}

.ji-panel .ji-figure-label {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  white-space: nowrap;
  overflow: hidden;
  text-overflow: ellipsis;
}

.ji-panel .ji-section-head {
  display: flex;
  flex-wrap: wrap;
  align-items: baseline;
  justify-content: space-between;
  gap: 2px 8px;
}

.ji-panel .ji-hint {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
}

.ji-panel .ji-timeline-host {
  min-width: 0;
}

.ji-panel .ji-prompt-text {
  width: 100%;
  box-sizing: border-box;
  resize: vertical;
  min-height: 48px;
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color0);
  background: var(--jp-input-background, var(--jp-layout-color1));
  border: var(--jp-border-width) solid var(--jp-input-border-color, var(--jp-border-color1));
  padding: 4px 6px;
}

.ji-panel .ji-prompt-controls {
  display: flex;
  flex-wrap: wrap;
  align-items: center;
  gap: 6px 10px;
}

.ji-panel .ji-number {
  display: inline-flex;
  align-items: center;
  gap: 4px;
  color: var(--jp-ui-font-color2);
}

.ji-panel .ji-number input {
  width: 64px;
  box-sizing: border-box;
  color: var(--jp-ui-font-color0);
  background: var(--jp-input-background, var(--jp-layout-color1));
  border: var(--jp-border-width) solid var(--jp-input-border-color, var(--jp-border-color1));
  padding: 2px 4px;
}

.ji-panel .ji-button {
  padding: 3px 14px;
  border-radius: 2px;
  border: var(--jp-border-width) solid var(--jp-border-color1);
  font-size: var(--jp-ui-font-size1);
  cursor: pointer;
  background: var(--jp-layout-color2);
  color: var(--jp-ui-font-color1);
}

.ji-panel .ji-send {
  background: var(--jp-brand-color1);
  border-color: var(--jp-brand-color1);
  color: var(--jp-ui-inverse-font-color0);
}

.ji-panel .ji-stop:not(:disabled) {
  border-color: var(--jp-error-color1);
  color: var(--jp-error-color1);
}

.ji-panel .ji-button:disabled {
  cursor: default;
  opacity: 0.5;
}

.ji-panel .ji-output {
  min-height: 2.5em;
  max-height: 240px;
  overflow-y: auto;
  padding: 6px 8px;
  white-space: pre-wrap;
  overflow-wrap: anywhere;
  font-family: var(--jp-content-font-family);
  font-size: var(--jp-content-font-size1);
  line-height: var(--jp-content-line-height);
  color: var(--jp-content-font-color1);
  background: var(--jp-layout-color0);
  border: 1px solid var(--jp-border-color2);
  border-radius: 2px;
}

.ji-panel .ji-output:empty::before {
  content: 'The answer streams here.';
  color: var(--jp-ui-font-color3);
}

.ji-panel .ji-output[data-state='stopped'] {
  border-color: var(--jp-warn-color1);
}

.ji-panel .ji-output[data-state='error'] {
  border-color: var(--jp-error-color1);
}

.ji-panel .ji-result {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  min-height: 1.2em;
}

.ji-status-item {
  padding: 0 6px;
  cursor: pointer;
  white-space: nowrap;
  line-height: 24px;
  color: var(--jp-ui-font-color1);
}

.ji-status-item:hover {
  background: var(--jp-layout-color2);
}

.ji-status-item[data-state='failed'],
.ji-status-item[data-state='offline'] {
  color: var(--jp-error-color1);
}

.ji-panel .ji-figure-outcomes {
  grid-column: 1 / -1;
}

.ji-panel .ji-field[data-field='limits'] .ji-field-value {
  white-space: normal;
}

.ji-panel .ji-link {
  padding: 0;
  border: none;
  background: none;
  color: var(--jp-content-link-color);
  font-size: var(--jp-ui-font-size0);
  cursor: pointer;
}

.ji-panel .ji-link:hover {
  text-decoration: underline;
}

.ji-timeline-widget {
  padding: 8px 12px;
  overflow: auto;
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
}

.ji-timeline-widget .ji-section-head {
  display: flex;
  flex-wrap: wrap;
  align-items: baseline;
  gap: 2px 12px;
  margin-bottom: 6px;
}

.ji-timeline-widget .ji-subheading {
  margin: 0;
  font-size: var(--jp-ui-font-size1);
  font-weight: 600;
}

.ji-timeline-widget .ji-hint {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
}

.ji-timeline-widget .ji-notice {
  padding: 4px 8px;
  margin-bottom: 6px;
  border-left: 3px solid var(--jp-info-color1);
  background: var(--jp-layout-color2);
}

.ji-timeline-widget .ji-notice[data-kind='error'] {
  border-left-color: var(--jp-error-color1);
}

.ji-panel .ji-figure-outcomes .ji-figure-value {
  font-size: var(--jp-ui-font-size1);
  white-space: normal;
}

.ji-panel .ji-prompt-buttons {
  display: flex;
  gap: 6px;
  margin-left: auto;
}

.ji-panel .ji-figure-ttft .ji-figure-value,
.ji-panel .ji-figure-latency .ji-figure-value {
  font-size: var(--jp-ui-font-size1);
  line-height: calc(var(--jp-ui-font-size2) * 1.25);
}

.ji-panel .ji-state[data-state='switching'],
.ji-panel .ji-state[data-state='starting'] {
  border-color: var(--jp-warn-color1);
  color: var(--jp-warn-color0);
}

.ji-panel .ji-state[data-state='unloaded'] {
  color: var(--jp-ui-font-color2);
}

/* Models: the list, a name box, weights, Load / Unload. */
.ji-panel .ji-models-count {
  margin-right: auto;
}

.ji-panel .ji-model-list {
  list-style: none;
  margin: 0;
  padding: 0;
  max-height: 168px;
  overflow-y: auto;
  border: 1px solid var(--jp-border-color2);
  border-radius: 2px;
  background: var(--jp-layout-color0);
}

.ji-panel .ji-model-row {
  display: flex;
  align-items: baseline;
  gap: 8px;
  padding: 3px 6px;
  cursor: pointer;
  border-left: 3px solid transparent;
}

.ji-panel .ji-model-row + .ji-model-row {
  border-top: 1px solid var(--jp-border-color3);
}

.ji-panel .ji-model-row:hover {
  background: var(--jp-layout-color2);
}

.ji-panel .ji-model-row[aria-selected='true'] {
  background: var(--jp-layout-color2);
  /* a tint of the brand colour that keeps the text readable in light and dark themes */
  background: color-mix(in srgb, var(--jp-brand-color1) 18%, var(--jp-layout-color0));
  border-left-color: var(--jp-brand-color1);
}

.ji-panel .ji-model-row[data-loaded='true'] .ji-model-name {
  font-weight: 600;
}

.ji-panel .ji-model-name {
  flex: 0 1 auto;
  min-width: 0;
  overflow-wrap: anywhere;
  color: var(--jp-ui-font-color0);
}

.ji-panel .ji-model-meta {
  flex: 1 0 auto;
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  white-space: nowrap;
}

.ji-panel .ji-model-badge {
  flex: none;
  padding: 0 6px;
  border-radius: 8px;
  border: 1px solid var(--jp-border-color1);
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  white-space: nowrap;
}

.ji-panel .ji-badge-loaded {
  border-color: var(--jp-success-color1);
  color: var(--jp-success-color1);
}

.ji-panel .ji-badge-loading {
  border-color: var(--jp-warn-color1);
  color: var(--jp-warn-color0);
}

.ji-panel .ji-model-empty {
  padding: 4px 6px;
}

.ji-panel .ji-model-controls {
  display: flex;
  flex-wrap: wrap;
  align-items: center;
  gap: 6px 10px;
}

.ji-panel .ji-model-input {
  flex: 1 1 100%;
  min-width: 0;
  box-sizing: border-box;
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color0);
  background: var(--jp-input-background, var(--jp-layout-color1));
  border: var(--jp-border-width) solid var(--jp-input-border-color, var(--jp-border-color1));
  padding: 3px 6px;
}

.ji-panel .ji-weights {
  color: var(--jp-ui-font-color0);
  background: var(--jp-input-background, var(--jp-layout-color1));
  border: var(--jp-border-width) solid var(--jp-input-border-color, var(--jp-border-color1));
  font-size: var(--jp-ui-font-size1);
  padding: 1px 2px;
}

.ji-panel .ji-load:not(:disabled) {
  background: var(--jp-brand-color1);
  border-color: var(--jp-brand-color1);
  color: var(--jp-ui-inverse-font-color0);
}

.ji-panel .ji-model-message {
  padding: 2px 8px;
  border-left: 3px solid var(--jp-info-color1);
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color1);
  overflow-wrap: anywhere;
}

.ji-panel .ji-model-message[data-kind='error'] {
  border-left-color: var(--jp-error-color1);
  color: var(--jp-error-color0);
}

/* A managed child server (vLLM...): summary, error, last log lines. */
.ji-panel .ji-child-summary {
  color: var(--jp-ui-font-color0);
}

.ji-panel .ji-child[data-trouble='true'] .ji-child-summary {
  color: var(--jp-error-color0);
}

.ji-panel .ji-child-error {
  color: var(--jp-error-color0);
  overflow-wrap: anywhere;
}

.ji-panel .ji-child-log {
  margin: 0;
  max-height: 9.5em;
  overflow: auto;
  padding: 4px 6px;
  white-space: pre-wrap;
  overflow-wrap: anywhere;
  font-family: var(--jp-code-font-family);
  font-size: calc(var(--jp-code-font-size) * 0.85);
  line-height: 1.35;
  color: var(--jp-content-font-color1);
  background: var(--jp-layout-color0);
  border: 1px solid var(--jp-border-color2);
  border-radius: 2px;
}

.ji-panel .ji-child-where {
  overflow-wrap: anywhere;
}

.ji-panel .ji-section[hidden] {
  display: none;
}
`,""]),r.d(i,{},{A:p})},813(e,i,r){var o=r(601),a=r.n(o),t=r(314),n=(r.n(t))()(a());n.push([e.id,`/* The batch timeline, shared by the side panel and the notebook widget (copied to
   jupyter_infer/widgets/static/timeline.css by the build). JupyterLab theme variables only;
   the fallbacks serve front ends without them. */

.ji-timeline {
  /* Decoding, by rows in the batch: light (few) to dark (many). */
  --ji-size-0: var(--jp-brand-color3, #bbdefb);
  --ji-size-1: var(--jp-brand-color2, #64b5f6);
  --ji-size-2: var(--jp-brand-color1, #1976d2);
  --ji-size-3: var(--jp-brand-color0, #0d47a1);
  --ji-prefill: var(--jp-warn-color1, #f57c00);
  --ji-queued-bg: var(--jp-layout-color2, #eeeeee);
  --ji-queued-line: var(--jp-border-color1, #bdbdbd);
  --ji-waiting: var(--jp-layout-color3, #bdbdbd);

  position: relative;
  font-family: var(--jp-ui-font-family, system-ui, sans-serif);
  font-size: 11px;
  color: var(--jp-ui-font-color1, #212121);
  min-width: 0;
}

.ji-timeline .ji-title {
  font-weight: 600;
  margin: 2px 0 4px;
}

.ji-timeline .ji-tl-box {
  position: relative;
}

.ji-timeline .ji-tl-body {
  overflow-x: hidden;
  overflow-y: auto;
}

.ji-timeline .ji-tl-body[data-empty]::before {
  content: attr(data-empty);
  display: block;
  padding: 8px 4px;
  color: var(--jp-ui-font-color2, #616161);
}

.ji-timeline svg {
  display: block;
  overflow: visible;
}

.ji-timeline svg text {
  fill: var(--jp-ui-font-color1, #212121);
  font-size: 11px;
}

.ji-timeline .ji-axis text,
.ji-timeline .ji-track-label {
  fill: var(--jp-ui-font-color2, #616161);
}

.ji-timeline .ji-grid {
  stroke: var(--jp-border-color2, #e0e0e0);
  stroke-width: 1;
}

.ji-timeline .ji-band {
  stroke: var(--jp-layout-color1, #ffffff);
  stroke-width: 1;
}

.ji-timeline .ji-band-label {
  pointer-events: none;
  font-weight: 600;
}

.ji-timeline .ji-row-bg {
  fill: transparent;
}

.ji-timeline .ji-row:hover .ji-row-bg {
  fill: var(--jp-layout-color2, #eeeeee);
}

.ji-timeline .ji-clickable {
  cursor: pointer;
}

.ji-timeline .ji-clickable:hover .ji-part {
  stroke: var(--jp-error-color1, #d32f2f);
  stroke-width: 1.5;
}

.ji-timeline .ji-size-0 { fill: var(--ji-size-0); background: var(--ji-size-0); }
.ji-timeline .ji-size-1 { fill: var(--ji-size-1); background: var(--ji-size-1); }
.ji-timeline .ji-size-2 { fill: var(--ji-size-2); background: var(--ji-size-2); }
.ji-timeline .ji-size-3 { fill: var(--ji-size-3); background: var(--ji-size-3); }

.ji-timeline .ji-prefill { fill: var(--ji-prefill); }
.ji-timeline .ji-waiting { fill: var(--ji-waiting); }
.ji-timeline .ji-hatch-bg { fill: var(--ji-queued-bg); }
.ji-timeline .ji-hatch-line { stroke: var(--ji-queued-line); stroke-width: 2; }
.ji-timeline .ji-unknown-bg { fill: var(--ji-size-1); opacity: 0.35; }
.ji-timeline .ji-unknown-line { fill: var(--ji-size-1); }
.ji-timeline .ji-queued { stroke: var(--ji-queued-line); stroke-width: 0.5; }
.ji-timeline .ji-parked { fill: var(--ji-queued-bg); stroke: var(--ji-size-1); stroke-width: 1; stroke-dasharray: 3 2; }

.ji-timeline .ji-marker {
  font-weight: 700;
  /* A halo in the background colour keeps the mark legible where it overlaps the bar. */
  paint-order: stroke;
  stroke: var(--jp-layout-color1, #ffffff);
  stroke-width: 3px;
}

/* A cancelled or failed request reads as such at a glance, not only by its mark. */
.ji-timeline .ji-ended-cancelled .ji-part,
.ji-timeline .ji-ended-failed .ji-part {
  opacity: 0.5;
}

.ji-timeline .ji-cancelled,
.ji-timeline svg text.ji-cancelled,
.ji-timeline .ji-failed,
.ji-timeline svg text.ji-failed {
  fill: var(--jp-error-color1, #d32f2f);
  color: var(--jp-error-color1, #d32f2f);
}

.ji-timeline .ji-cut-bg {
  fill: var(--jp-layout-color2, #eeeeee);
}

.ji-timeline .ji-cut-edge {
  stroke: var(--jp-border-color1, #bdbdbd);
  stroke-dasharray: 2 2;
}

.ji-timeline .ji-tl-tip {
  position: absolute;
  z-index: 10;
  max-width: 320px;
  padding: 4px 6px;
  pointer-events: none;
  background: var(--jp-layout-color0, #ffffff);
  color: var(--jp-ui-font-color0, #000000);
  border: 1px solid var(--jp-border-color1, #bdbdbd);
  box-shadow: var(--jp-elevation-z4, 0 2px 4px rgba(0, 0, 0, 0.2));
  line-height: 1.4;
  white-space: normal;
  overflow-wrap: anywhere;
}

.ji-timeline .ji-tl-tip .ji-tip-head {
  font-weight: 600;
}

.ji-timeline .ji-legend {
  display: flex;
  flex-wrap: wrap;
  gap: 4px 14px;
  align-items: center;
  margin: 6px 0 2px;
  color: var(--jp-ui-font-color2, #616161);
}

.ji-timeline .ji-legend-item {
  display: inline-flex;
  align-items: center;
  gap: 4px;
  white-space: nowrap;
}

.ji-timeline .ji-legend-sizes {
  flex-wrap: wrap;
  white-space: normal;
}

/* The marks' keys are sentences: in a narrow side panel they wrap rather than being cut. */
.ji-timeline .ji-ff-key,
.ji-timeline .ji-guess-key {
  white-space: normal;
}

.ji-timeline .ji-swatch {
  display: inline-block;
  width: 14px;
  height: 10px;
  border: 1px solid var(--jp-border-color1, #bdbdbd);
}

.ji-timeline .ji-swatch-queued {
  background: repeating-linear-gradient(
    45deg,
    var(--ji-queued-bg) 0 3px,
    var(--ji-queued-line) 3px 5px
  );
}

.ji-timeline .ji-swatch-waiting { background: var(--ji-waiting); }
.ji-timeline .ji-swatch-prefill { background: var(--ji-prefill); }

.ji-timeline .ji-swatch-parked {
  background: var(--ji-queued-bg);
  border: 1px dashed var(--ji-size-1);
}

.ji-timeline .ji-swatch-decode-unknown {
  background: repeating-linear-gradient(
    90deg,
    var(--ji-size-1) 0 2px,
    transparent 2px 4px
  );
}

.ji-timeline .ji-size-chip {
  display: inline-block;
  min-width: 14px;
  padding: 0 4px;
  text-align: center;
  font-weight: 600;
  border-radius: 2px;
}

.ji-timeline .ji-legend-summary {
  color: var(--jp-ui-font-color2, #616161);
}

/* Adjacent spans of one row must meet without an anti-aliased seam between them. */
.ji-timeline .ji-part,
.ji-timeline .ji-band {
  shape-rendering: crispEdges;
}
`,""]),r.d(i,{},{A:n})},314(e){e.exports=function(e){var i=[];return i.toString=function(){return this.map(function(i){var r="",o=void 0!==i[5];return i[4]&&(r+="@supports (".concat(i[4],") {")),i[2]&&(r+="@media ".concat(i[2]," {")),o&&(r+="@layer".concat(i[5].length>0?" ".concat(i[5]):""," {")),r+=e(i),o&&(r+="}"),i[2]&&(r+="}"),i[4]&&(r+="}"),r}).join("")},i.i=function(e,r,o,a,t){"string"==typeof e&&(e=[[null,e,void 0]]);var n={};if(o)for(var l=0;l<this.length;l++){var p=this[l][0];null!=p&&(n[p]=!0)}for(var d=0;d<e.length;d++){var j=[].concat(e[d]);o&&n[j[0]]||(void 0!==t&&(void 0===j[5]||(j[1]="@layer".concat(j[5].length>0?" ".concat(j[5]):""," {").concat(j[1],"}")),j[5]=t),r&&(j[2]&&(j[1]="@media ".concat(j[2]," {").concat(j[1],"}")),j[2]=r),a&&(j[4]?(j[1]="@supports (".concat(j[4],") {").concat(j[1],"}"),j[4]=a):j[4]="".concat(a)),i.push(j))}},i}},601(e){e.exports=function(e){return e[1]}},691(e){var i=[];function r(e){for(var r=-1,o=0;o<i.length;o++)if(i[o].identifier===e){r=o;break}return r}function o(e,o){for(var a={},t=[],n=0;n<e.length;n++){var l=e[n],p=o.base?l[0]+o.base:l[0],d=a[p]||0,j="".concat(p," ").concat(d);a[p]=d+1;var c=r(j),s={css:l[1],media:l[2],sourceMap:l[3],supports:l[4],layer:l[5]};if(-1!==c)i[c].references++,i[c].updater(s);else{var u=function(e,i){var r=i.domAPI(i);return r.update(e),function(i){i?(i.css!==e.css||i.media!==e.media||i.sourceMap!==e.sourceMap||i.supports!==e.supports||i.layer!==e.layer)&&r.update(e=i):r.remove()}}(s,o);o.byIndex=n,i.splice(n,0,{identifier:j,updater:u,references:1})}t.push(j)}return t}e.exports=function(e,a){var t=o(e=e||[],a=a||{});return function(e){e=e||[];for(var n=0;n<t.length;n++){var l=r(t[n]);i[l].references--}for(var p=o(e,a),d=0;d<t.length;d++){var j=r(t[d]);0===i[j].references&&(i[j].updater(),i.splice(j,1))}t=p}}},659(e){var i={};e.exports=function(e,r){var o=function(e){if(void 0===i[e]){var r=document.querySelector(e);if(window.HTMLIFrameElement&&r instanceof window.HTMLIFrameElement)try{r=r.contentDocument.head}catch(e){r=null}i[e]=r}return i[e]}(e);if(!o)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");o.appendChild(r)}},540(e){e.exports=function(e){var i=document.createElement("style");return e.setAttributes(i,e.attributes),e.insert(i,e.options),i}},56(e,i,r){e.exports=function(e){var i=r.nc;i&&e.setAttribute("nonce",i)}},206(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var i=e.insertStyleElement(e);return{update:function(r){var o,a,t;o="",r.supports&&(o+="@supports (".concat(r.supports,") {")),r.media&&(o+="@media ".concat(r.media," {")),(a=void 0!==r.layer)&&(o+="@layer".concat(r.layer.length>0?" ".concat(r.layer):""," {")),o+=r.css,a&&(o+="}"),r.media&&(o+="}"),r.supports&&(o+="}"),(t=r.sourceMap)&&"u">typeof btoa&&(o+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(t))))," */")),e.styleTagTransform(o,i,e.options)},remove:function(){var e;null===(e=i).parentNode||e.parentNode.removeChild(e)}}}},113(e){e.exports=function(e,i){if(i.styleSheet)i.styleSheet.cssText=e;else{for(;i.firstChild;)i.removeChild(i.firstChild);i.appendChild(document.createTextNode(e))}}},959(e,i,r){var o=r(691),a=r.n(o),t=r(206),n=r.n(t),l=r(659),p=r.n(l),d=r(56),j=r.n(d),c=r(540),s=r.n(c),u=r(113),f=r.n(u),v=r(646),m={};m.styleTagTransform=f(),m.setAttributes=j(),m.insert=p().bind(null,"head"),m.domAPI=n(),m.insertStyleElement=s(),a()(v.A,m),v.A&&v.A.locals&&v.A.locals}}]);