// What the batch timeline draws. Field names follow the server's records (`infer/batches`)
// and `jupyter_infer.widgets.timeline.timeline_data`; times are epoch seconds.

/** One request: a row of the timeline. */
export interface ITimelineRow {
  id: string;
  /** Short text for the row's label (a prompt's start, "#3 …"); defaults to the id. */
  label?: string;
  queued_at?: number | null;
  admitted_at?: number | null;
  first_token_at?: number | null;
  finished_at?: number | null;
  /** The batch spans the request was a member of, oldest first. */
  batch_ids?: number[];
  /** queued | running | ok | cancelled | failed | error */
  outcome?: string | null;
  tokens?: number | null;
  prompt_tokens?: number | null;
}

/** One batch span: constant membership from `started_at` to `ended_at` (null: still open). */
export interface ITimelineBatch {
  id: number;
  size?: number;
  members?: string[];
  started_at?: number | null;
  ended_at?: number | null;
  steps?: number;
  tokens?: number;
  mode?: string | null;
}

export interface ITimelineState {
  rows: ITimelineRow[];
  batches: ITimelineBatch[];
  /** Where running rows and open batches end (epoch s); null for a finished run. */
  now?: number | null;
  title?: string;
}
