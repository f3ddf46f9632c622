// What the batch timeline draws. Field names follow the server's records (`infer/batches`)
// and `jupyter_infer.kernel.widgets.timeline.timeline_data`; times are epoch seconds.

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
  /** What the answer was held to: null, or the constraint's kind (json_object, json_schema,
   * regex, choice, grammar, tools). */
  constraint?: string | null;
  /** Of its `tokens`, those its grammar forced (fast-forwarded, not sampled). */
  forced_tokens?: number | null;
  /** Fair share on a shared server: when it sat out for another user's request, and when it
   * came back (the last one may still be missing: parked now). */
  parked_at?: number[];
  resumed_at?: number[];
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
  /** Of its tokens, those grammars forced (fast-forward). */
  forced_tokens?: number;
  /** Speculative decoding: draft tokens its rows proposed, and those their model accepted
   * (tokens beyond one a row a step). */
  draft_tokens?: number;
  accepted_tokens?: number;
  mode?: string | null;
}

/** A step that emitted several tokens a row: forced ones (live `step` events with `forced` >
 * 0) or draft guesses the model accepted (`accepted` > 0, speculative decoding). */
export interface ITimelineStep {
  batch_id?: number | null;
  /** When the step ended (epoch s). */
  at: number;
  tokens?: number;
  forced: number;
  accepted?: number;
}

export interface ITimelineState {
  rows: ITimelineRow[];
  batches: ITimelineBatch[];
  /** Steps that fast-forwarded tokens or kept guesses, where known (the live stream; records
   * keep counts only). */
  steps?: ITimelineStep[];
  /** Where running rows and open batches end (epoch s); null for a finished run. */
  now?: number | null;
  title?: string;
}
